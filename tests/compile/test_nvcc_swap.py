"""Real nvcc on A/B-swapped fp8 row-wise kernels (`swap_ab`): the small-M tiles of vLLM's
swapped kernels build without spills, the smem model holds, and the host-side `can_implement`
takes the caller's problem (M x N x K) as an unswapped kernel does, M of 16 included.

Runs without a GPU, like test_nvcc.py: the smem queries and `can_implement` are host code.
"""

import pytest

from cutlass_tune.kernel import LoadedKernel, make_args
from cutlass_tune.space import (
    DType,
    Epilogue,
    EpilogueSchedule,
    KernelConfig,
    KernelSchedule,
    Problem,
    RuntimeArgs,
    Scaling,
)

from .conftest import build_and_check_smem

ROWCOL = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, scaling=Scaling.ROWCOL, swap_ab=True)
PINGPONG = dict(kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA)
SWAPPED = [
    KernelConfig(**ROWCOL, **PINGPONG, tile_m=64, tile_n=16, tile_k=256, fp8_fast_accum=True,
                 epilogue_source=False),
    KernelConfig(**ROWCOL, **PINGPONG, tile_m=64, tile_n=64, tile_k=256, cluster_n=2, fp8_fast_accum=True,
                 epilogue=Epilogue.parse("bias"), epilogue_source=False),
]


@pytest.mark.nvcc
def test_swapped_fp8_kernels_build_match_the_smem_model_and_take_the_callers_problem(tmp_path):
    for r in build_and_check_smem(SWAPPED, tmp_path):
        kernel = LoadedKernel(r.library, r.symbol)

        def can_implement(m, n, k, cfg=r.config):
            p = Problem(m, n, k, **cfg.operation_fields())
            # sm_count given: no device query. Null operand pointers: can_implement reads none.
            return kernel.can_implement(make_args(p, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=132))

        for m in (16, 32, 64, 4093):
            assert can_implement(m, 4096, 4096) == 0, (r.config.name, m)
        assert can_implement(64, 4096, 4104) != 0  # K rows of fp8 A and B need 16 elements
