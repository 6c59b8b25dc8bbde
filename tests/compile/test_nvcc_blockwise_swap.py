"""Real nvcc on A/B-swapped block-wise fp8 kernels (`swap_ab` with block-wise scales): the kernel
computes D^T = W X^T, its tile M over the weights' N (one scale block a tile: tile M = scale_n)
and its tile N over the tokens (one group scale per column), CUTLASS 4.2's FP8Blockwise mainloop
with Sm90BlockwiseScaleConfig<scale_n, 1, 128, K, MN>. These tiles build without spills, hold
the smem model, and `can_implement` takes the caller's decode shapes (M x N x K, unswapped).

Runs without a GPU, like test_nvcc_blockwise_narrow.py (16 kernels: about 7 minutes on 2 cores).
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

SWAP = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128, scaling=Scaling.BLOCKWISE, swap_ab=True,
            epilogue_source=False)
PINGPONG = dict(SWAP, tile_m=64, scale_n=64, kernel_schedule=KernelSchedule.PINGPONG,
                epilogue_schedule=EpilogueSchedule.TMA)
COOPERATIVE = dict(SWAP, tile_m=128, scale_n=128)
SWAPPED = [
    *(KernelConfig(**PINGPONG, tile_n=n, cluster_m=c) for n in (16, 32, 64) for c in (1, 2)),
    *(KernelConfig(**COOPERATIVE, tile_n=n, cluster_m=c) for n in (16, 32, 64) for c in (1, 2)),
    KernelConfig(**PINGPONG, tile_n=128),
    KernelConfig(**COOPERATIVE, tile_n=128),
    KernelConfig(**{**PINGPONG, "tile_m": 128, "scale_n": 128}, tile_n=64),  # the widest ping-pong 128-row tile
    KernelConfig(**PINGPONG, tile_n=32, epilogue=Epilogue.parse("bias+silu")),  # the bias: a column broadcast
]
DECODE = ((16, 24576, 1536), (32, 7168, 2048), (64, 4096, 7168), (128, 32768, 512), (256, 7168, 16384),
          (4, 384, 128))


@pytest.mark.nvcc
def test_swapped_blockwise_kernels_build_match_the_smem_model_and_take_decode_shapes(tmp_path):
    for r in build_and_check_smem(SWAPPED, tmp_path):
        kernel = LoadedKernel(r.library, r.symbol)
        for m, n, k in DECODE:
            problem = Problem(m, n, k, **r.config.operation_fields())
            # sm_count given: no device query. Null pointers: can_implement reads none.
            args = make_args(problem, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=132)
            assert kernel.can_implement(args) == 0, (r.config.name, m, n, k)
