"""Real nvcc on grouped (ptr-array) kernels: a cooperative and a ping-pong one build in one unit
without spills, export every ABI entry point, match the grouped smem model exactly, and their
host-side checks and workspace size follow ABI 4's grouped contract.

Runs without a GPU, like test_nvcc.py: the smem queries, `can_implement` and `workspace_size`
are host code (sm_count given, so no device query).
"""

import ctypes

import pytest

from cutlass_tune.compile import KernelCache, compile_kernels, find_toolchain
from cutlass_tune.kernel import ABI_VERSION, LoadedKernel, make_args
from cutlass_tune.space import (
    MAX_GROUPS,
    DType,
    EpilogueSchedule,
    Grouping,
    KernelConfig,
    KernelSchedule,
    Layout,
    Problem,
    RuntimeArgs,
    check_config,
    smem_usage,
)
from cutlass_tune.space.cutlass import KERNEL_SMEM_ALLOWANCE_BYTES
from cutlass_tune.status import Status

F16 = dict(dtype_a=DType.F16, dtype_b=DType.F16, dtype_c=DType.F16, dtype_d=DType.F16)
GROUPED = [
    KernelConfig(grouping=Grouping.GROUPED),  # bf16 tn, cooperative 128x128, C aliasing D
    KernelConfig(grouping=Grouping.GROUPED, **F16, layout_b=Layout.ROW, tile_m=64, epilogue_source=False,
                 kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA),
]
SM_COUNT = 132
DESCRIPTOR = 128  # bytes of one TMA descriptor


def build_grouped(cache_dir):
    """Compile GROUPED into one unit and check each kernel's build, ABI and smem model."""
    for cfg in GROUPED:
        assert check_config(cfg) == [], cfg.name
    results = compile_kernels(GROUPED, cache=KernelCache(cache_dir), toolchain=find_toolchain(), jobs=1,
                              kernels_per_unit=len(GROUPED))
    for r in results:
        assert r.status is Status.OK, f"{r.config.name}: {r.reason} (log {r.log_path})"
        assert not r.reason, f"{r.config.name}: {r.reason}"  # e.g. ptxas spilled
    assert len({r.library for r in results}) == 1
    for r in results:
        lib = ctypes.CDLL(str(r.library))
        assert lib.cutlass_tune_abi_version() == ABI_VERSION
        model = smem_usage(r.config)
        assert getattr(lib, f"{r.symbol}_stages")() == model.stages, r.config.name
        assert getattr(lib, f"{r.symbol}_shared_storage_bytes")() == model.total_bytes, r.config.name
        assert model.kernel_bytes <= KERNEL_SMEM_ALLOWANCE_BYTES, r.config.name
        assert getattr(lib, f"{r.symbol}_mma_n")() == r.config.tile_n, r.config.name
    return results


def _arrays_bytes(groups: int, source: bool) -> int:
    """The per-group arrays the template lays out: shapes (3 ints), A/B/[C]/D pointers, A/B/D strides."""
    round128 = lambda b: -(-b // 128) * 128  # noqa: E731
    return round128(12 * groups) + (4 if source else 3) * round128(8 * groups) + 3 * round128(8 * groups)


@pytest.mark.nvcc
def test_grouped_kernels_build_export_the_abi_and_check_their_arguments(tmp_path):
    for r in build_grouped(tmp_path):
        cfg = r.config
        kernel = LoadedKernel(r.library, r.symbol)  # binds every ABI entry point or raises
        problem = Problem.experts(128, 1536, 2048, 32768, **cfg.operation_fields())
        args = make_args(problem, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=SM_COUNT)
        assert args.groups == 128
        assert kernel.can_implement(args) == 0, cfg.name
        # CUTLASS's workspace: A and B descriptors, C's where there is C and one D per consumer warpgroup, per SM
        descriptors = SM_COUNT * DESCRIPTOR * (2 + (1 if cfg.epilogue_source else 0) + 2)
        assert kernel.workspace_size(args) == _arrays_bytes(128, cfg.epilogue_source) + descriptors, cfg.name

        for field, value in [("groups", 0), ("groups", MAX_GROUPS + 1), ("n", 1540), ("k", 2044), ("m", -1)]:
            bad = make_args(problem, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=SM_COUNT)
            setattr(bad, field, value)
            assert kernel.can_implement(bad) != 0, (cfg.name, field, value)
            assert kernel.workspace_size(bad) == 0, (cfg.name, field, value)
        most = make_args(problem, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=SM_COUNT)
        most.groups = MAX_GROUPS
        assert kernel.can_implement(most) == 0, cfg.name
