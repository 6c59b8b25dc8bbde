"""Real nvcc on fp8 kernels: the FP8FastAccum schedules build, the smem model holds for one-byte
elements, and the host-side `can_implement` enforces 16-element (16-byte) rows of K.

Runs without a GPU, like test_nvcc.py: `can_implement` is host code.
"""

import ctypes

import pytest

from cutlass_tune.bench import LoadedKernel, make_args
from cutlass_tune.compile import KernelCache, compile_kernels, find_toolchain
from cutlass_tune.render import ABI_VERSION
from cutlass_tune.space import (
    DType,
    EpilogueSchedule,
    KernelConfig,
    KernelSchedule,
    Problem,
    RuntimeArgs,
    check_config,
    smem_usage,
)
from cutlass_tune.space._rules import KERNEL_SMEM_ALLOWANCE_BYTES, SMEM_CAPACITY_BYTES
from cutlass_tune.status import Status

E4M3 = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_c=DType.BF16, dtype_d=DType.BF16)
FP8_CONFIGS = [
    KernelConfig(**E4M3, tile_m=128, tile_n=128, tile_k=128, fp8_fast_accum=True),
    KernelConfig(**E4M3, tile_m=64, tile_n=128, tile_k=128, kernel_schedule=KernelSchedule.PINGPONG,
                 epilogue_schedule=EpilogueSchedule.TMA, fp8_fast_accum=True),
]


@pytest.mark.nvcc
def test_fp8_fast_accum_configs_build_and_match_the_smem_model(tmp_path):
    for cfg in FP8_CONFIGS:
        assert check_config(cfg) == [], cfg.name
    results = compile_kernels(FP8_CONFIGS, cache=KernelCache(tmp_path), toolchain=find_toolchain(), jobs=2)
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
        assert actual <= model.total_bytes, (r.config.name, actual, model)
        assert model.total_bytes - actual <= KERNEL_SMEM_ALLOWANCE_BYTES, (r.config.name, actual, model)

        kernel = LoadedKernel(r.library, r.symbol)

        def can_implement(m, n, k):
            p = Problem(m, n, k, DType.E4M3, DType.E4M3, DType.BF16)
            # sm_count given: no device query, so this runs without a GPU.
            return kernel.can_implement(make_args(p, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=132))

        assert can_implement(4096, 4096, 4096) == 0, r.config.name
        assert can_implement(4096, 4104, 4096) == 0  # N is the row of the bf16 D: 8 elements suffice
        assert can_implement(4096, 4096, 4104) != 0  # K rows of fp8 A and B need 16 elements
