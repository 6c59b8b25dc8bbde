"""Real nvcc on fused epilogues: CUTLASS's fusion operations (bias, activations, residual), the
fp8 scale trees and the gated trees (activation(C) * (s * acc + bias)) build on cooperative and
ping-pong tiles without spills, the smem model holds with their bias and scale rows, and the
host-side checks take the ABI's pointers.

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

E4M3 = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128)
PINGPONG = dict(tile_m=64, kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA)
P = Epilogue.parse
FUSED = [
    KernelConfig(epilogue=P("bias+silu")),
    KernelConfig(**PINGPONG, epilogue=P("bias+gelu")),
    KernelConfig(epilogue=P("gelu_tanh"), epilogue_source=False),
    KernelConfig(**PINGPONG, epilogue=P("relu")),
    KernelConfig(epilogue=P("relu+residual")),
    KernelConfig(**E4M3, scaling=Scaling.TENSOR),
    KernelConfig(**E4M3, **PINGPONG, scaling=Scaling.ROWCOL),
    KernelConfig(**E4M3, scaling=Scaling.ROWCOL, epilogue=P("bias+silu"), epilogue_source=False),
]

# The up projection of a gated MLP: C (the gate's pre-activation) loaded by the TMA epilogue.
GATED = [
    KernelConfig(epilogue=P("bias+silu+gated")),
    KernelConfig(**PINGPONG, epilogue=P("gelu_tanh+gated")),
    KernelConfig(**E4M3, scaling=Scaling.ROWCOL, epilogue=P("silu+gated")),
]


def _check_arguments(results):
    for r in results:
        cfg = r.config
        kernel = LoadedKernel(r.library, r.symbol)
        problem = Problem(4096, 4096, 4096, **cfg.operation_fields())
        # sm_count given: no device query. Null operand pointers: can_implement reads none.
        args = make_args(problem, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=132)
        assert kernel.can_implement(args) == 0, cfg.name
        # M need not be a multiple of the row scales' vector width: they are read one by one
        odd = make_args(Problem(4093, 4096, 4096, **cfg.operation_fields()), RuntimeArgs(), a=0, b=0, d=0,
                        device_id=0, sm_count=132)
        assert kernel.can_implement(odd) == 0, cfg.name


@pytest.mark.nvcc
def test_fused_epilogues_build_match_the_smem_model_and_take_their_arguments(tmp_path):
    _check_arguments(build_and_check_smem(FUSED, tmp_path))


@pytest.mark.nvcc
def test_gated_epilogues_build_match_the_smem_model_and_take_their_arguments(tmp_path):
    _check_arguments(build_and_check_smem(GATED, tmp_path))
