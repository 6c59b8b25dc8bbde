"""Real nvcc on CUTLASS: configs the rules accept build, and the smem model matches them.

Runs in CI (nvcc is there, no GPU): the shared objects load without a GPU and their
constexpr entry points report what CUTLASS computed.
"""

import ctypes

import pytest

from cutlass_tune.compile import KernelCache, compile_kernels, find_toolchain
from cutlass_tune.render import ABI_VERSION
from cutlass_tune.space import (
    DType,
    EpilogueSchedule,
    KernelConfig,
    KernelSchedule,
    Layout,
    TileScheduler,
    check_config,
    smem_usage,
)
from cutlass_tune.space._rules import KERNEL_SMEM_ALLOWANCE_BYTES, SMEM_CAPACITY_BYTES
from cutlass_tune.status import Status

# Boundary configs: the largest fixed stage count that fits, Stream-K, every schedule and
# epilogue, all four layouts, f16 in and f32 out, clusters along either axis.
BOUNDARY = [
    KernelConfig(tile_n=256, cluster_m=2, stages=4, tile_scheduler=TileScheduler.STREAM_K),
    KernelConfig(tile_m=64, tile_n=128, cluster_n=2, kernel_schedule=KernelSchedule.PINGPONG,
                 epilogue_schedule=EpilogueSchedule.NO_SMEM, layout_a=Layout.COL, layout_b=Layout.ROW),
    KernelConfig(stages=7, kernel_schedule=KernelSchedule.TMA_WS, epilogue_schedule=EpilogueSchedule.TMA,
                 layout_a=Layout.COL, layout_b=Layout.COL),
    KernelConfig(tile_m=256, tile_n=64, cluster_m=4, dtype_a=DType.F16, dtype_b=DType.F16,
                 dtype_c=DType.F32, dtype_d=DType.F32, layout_b=Layout.ROW),
]


@pytest.mark.nvcc
def test_accepted_boundary_configs_build_and_match_the_smem_model(tmp_path):
    for cfg in BOUNDARY:
        assert check_config(cfg) == [], cfg.name
    toolchain = find_toolchain()
    results = compile_kernels(BOUNDARY, cache=KernelCache(tmp_path), toolchain=toolchain, jobs=2)
    for r in results:
        assert r.status is Status.OK, f"{r.config.name}: {r.reason} (log {r.log_path})"
    for r in results:
        lib = ctypes.CDLL(str(r.library))
        assert lib.cutlass_tune_abi_version() == ABI_VERSION
        stages = getattr(lib, f"{r.symbol}_stages")()
        actual = getattr(lib, f"{r.symbol}_shared_storage_bytes")()
        model = smem_usage(r.config)
        assert stages == model.stages, r.config.name
        assert actual <= SMEM_CAPACITY_BYTES
        # The model may overestimate by at most the kernel allowance, never underestimate.
        assert actual <= model.total_bytes, (r.config.name, actual, model)
        assert model.total_bytes - actual <= KERNEL_SMEM_ALLOWANCE_BYTES, (r.config.name, actual, model)


@pytest.mark.nvcc
def test_toolchain_reads_versions():
    tc = find_toolchain()
    assert tc.nvcc_version.count(".") == 2
    assert tc.cutlass_version.startswith("4.")
    assert all(d.is_dir() for d in tc.include_dirs)
    assert "-DNDEBUG" in tc.flags and "-gencode=arch=compute_90a,code=sm_90a" in tc.flags
