"""Real nvcc on block-wise fp8 kernels narrower along N than the 128-column scale block: CUTLASS
4.2's FP8Blockwise mainloop with Sm90BlockwiseScaleConfig<1, 64, 128> (or <1, 32, 128>) and tile
N 64 (32) builds without spills, holds the smem model, and `can_implement` takes the decode
shapes of the block-wise suite (their scale_b then is the expanded one, `expand_blockwise_scale_b`).

Runs without a GPU, like test_nvcc_blockwise.py.
"""

import pytest

from cutlass_tune.kernel import LoadedKernel, make_args
from cutlass_tune.space import DType, EpilogueSchedule, KernelConfig, KernelSchedule, Problem, RuntimeArgs, Scaling

from .conftest import build_and_check_smem

BW = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128, scaling=Scaling.BLOCKWISE)
PINGPONG = dict(tile_m=64, kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA)
NARROW = [
    KernelConfig(**BW, **PINGPONG, tile_n=64, scale_n=64, epilogue_source=False),
    KernelConfig(**BW, tile_n=64, scale_n=64, epilogue_source=False),
    KernelConfig(**BW, **PINGPONG, tile_n=32, scale_n=32, epilogue_source=False),
]


@pytest.mark.nvcc
def test_narrow_n_blockwise_kernels_build_match_the_smem_model_and_take_decode_shapes(tmp_path):
    for r in build_and_check_smem(NARROW, tmp_path):
        kernel = LoadedKernel(r.library, r.symbol)
        for m, n, k in ((16, 24576, 1536), (32, 7168, 2048), (64, 4096, 7168), (4, 384, 128)):
            problem = Problem(m, n, k, **r.config.operation_fields())
            args = make_args(problem, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=132)
            assert kernel.can_implement(args) == 0, (r.config.name, m, n, k)
