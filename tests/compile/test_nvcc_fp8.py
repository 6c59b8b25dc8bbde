"""Real nvcc on fp8 kernels: the FP8FastAccum schedules build, the smem model holds for one-byte
elements, and the host-side `can_implement` enforces 16-element (16-byte) rows of K.

Runs without a GPU, like test_nvcc.py: `can_implement` is host code.
"""

import pytest

from cutlass_tune.kernel import LoadedKernel, make_args
from cutlass_tune.space import (
    DType,
    EpilogueSchedule,
    KernelConfig,
    KernelSchedule,
    Problem,
    RuntimeArgs,
)

from .conftest import build_and_check_smem

E4M3 = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_c=DType.BF16, dtype_d=DType.BF16)
FP8_CONFIGS = [
    KernelConfig(**E4M3, tile_m=128, tile_n=128, tile_k=128, fp8_fast_accum=True),
    KernelConfig(**E4M3, tile_m=64, tile_n=128, tile_k=128, kernel_schedule=KernelSchedule.PINGPONG,
                 epilogue_schedule=EpilogueSchedule.TMA, fp8_fast_accum=True),
]


@pytest.mark.nvcc
def test_fp8_fast_accum_configs_build_and_match_the_smem_model(tmp_path):
    results = build_and_check_smem(FP8_CONFIGS, tmp_path)
    for r in results:
        kernel = LoadedKernel(r.library, r.symbol)

        def can_implement(m, n, k):
            p = Problem(m, n, k, dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16)
            # sm_count given: no device query, so this runs without a GPU.
            return kernel.can_implement(make_args(p, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=132))

        assert can_implement(4096, 4096, 4096) == 0, r.config.name
        assert can_implement(4096, 4104, 4096) == 0  # N is the row of the bf16 D: 8 elements suffice
        assert can_implement(4096, 4096, 4104) != 0  # K rows of fp8 A and B need 16 elements
