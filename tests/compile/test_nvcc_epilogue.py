"""Real nvcc on the epilogue knobs: kernels without a C operand and with a chosen epilogue
subtile build, the smem model holds for them, and a sourceless kernel refuses beta != 0.

Runs without a GPU, like test_nvcc.py: the smem queries and `can_implement` are host code.
"""

import pytest

from cutlass_tune.kernel import LoadedKernel, make_args
from cutlass_tune.space import (
    EpilogueSchedule,
    KernelConfig,
    KernelSchedule,
    Problem,
    RuntimeArgs,
)

from .conftest import build_and_check_smem

EPILOGUE_CONFIGS = [
    KernelConfig(kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA,
                 epilogue_source=False),
    KernelConfig(kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA,
                 epilogue_tile_n=64),
    KernelConfig(tile_n=256, cluster_n=2, epilogue_tile_n=64, epilogue_source=False),
    KernelConfig(tile_m=64, kernel_schedule=KernelSchedule.TMA_WS, epilogue_schedule=EpilogueSchedule.TMA,
                 epilogue_tile_n=128, epilogue_source=False),
]


@pytest.mark.nvcc
def test_epilogue_knobs_build_match_the_smem_model_and_sourceless_refuses_beta(tmp_path):
    results = build_and_check_smem(EPILOGUE_CONFIGS, tmp_path)
    problem = Problem(4096, 4096, 4096)
    for r in results:
        kernel = LoadedKernel(r.library, r.symbol)
        args = make_args(problem, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=132)
        assert kernel.can_implement(args) == 0, r.config.name
        args.beta = 1.0
        refused = kernel.can_implement(args) != 0
        # With a C operand beta is a run-time value; without one CUTLASS refuses it.
        assert refused is (not r.config.epilogue_source), r.config.name
