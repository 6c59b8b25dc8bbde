"""Real nvcc on block-wise fp8 kernels (A per 1x128 group, B per 128x128 block, applied by
CUTLASS 4.2's FP8Blockwise mainloop): cooperative and ping-pong, plain and with a bias and an
activation, build without spills, the smem model holds with the scales each stage keeps, and
`can_implement` takes the ABI's scale pointers and the shapes the problem rules let through.

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

BW = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128, scaling=Scaling.BLOCKWISE)
PINGPONG = dict(tile_m=64, kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA)
BLOCKWISE = [
    KernelConfig(**BW),
    KernelConfig(**BW, **PINGPONG, epilogue_source=False),
    KernelConfig(**BW, epilogue=Epilogue.parse("bias+silu"), epilogue_source=False),
]


@pytest.mark.nvcc
def test_blockwise_kernels_build_match_the_smem_model_and_take_their_arguments(tmp_path):
    for r in build_and_check_smem(BLOCKWISE, tmp_path):
        kernel = LoadedKernel(r.library, r.symbol)
        for m, n, k in ((4096, 4096, 4096), (64, 7168, 2048), (4, 384, 128)):
            problem = Problem(m, n, k, **r.config.operation_fields())
            # sm_count given: no device query. Null pointers: can_implement reads none.
            args = make_args(problem, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=132)
            assert kernel.can_implement(args) == 0, (r.config.name, m, n, k)
