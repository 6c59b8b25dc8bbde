"""The rules of fused epilogues and fp8 scaling (space/_rules.py)."""

import dataclasses

import pytest

from cutlass_tune.space import (
    DType,
    Epilogue,
    EpilogueSchedule,
    KernelConfig,
    KernelSchedule,
    Problem,
    Scaling,
    check_config,
    check_pair,
    check_problem,
    smem_usage,
)

FP8 = KernelConfig(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128)
NO_SMEM = dict(epilogue_schedule=EpilogueSchedule.NO_SMEM)


def rules(cfg):
    return [r.rule for r in check_config(cfg)]


def test_scaling_is_for_fp8_inputs_only():
    assert rules(KernelConfig(scaling=Scaling.TENSOR)) == ["scaling_inputs"]
    assert rules(dataclasses.replace(FP8, scaling=Scaling.ROWCOL)) == []
    (why,) = check_problem(Problem(256, 256, 256, scaling=Scaling.ROWCOL))
    assert why.rule == "scaling_inputs" and "fp8 inputs" in why.reason
    assert check_problem(Problem(256, 256, 256, dtype_a=DType.E4M3, dtype_b=DType.E4M3, scaling=Scaling.ROWCOL)) == []


def test_a_residual_needs_its_c_operand():
    assert rules(KernelConfig(epilogue=Epilogue(residual=True), epilogue_source=False)) == ["residual_source"]
    assert rules(KernelConfig(epilogue=Epilogue(residual=True))) == []


@pytest.mark.parametrize("cfg", [
    KernelConfig(epilogue=Epilogue.parse("bias"), **NO_SMEM),
    KernelConfig(epilogue=Epilogue.parse("relu"), **NO_SMEM),
    dataclasses.replace(FP8, scaling=Scaling.TENSOR, **NO_SMEM),
])
def test_fusions_need_a_tma_epilogue(cfg):
    """Guards against no_smem fused kernels: its builder takes LinearCombination alone (a static_assert)."""
    (why,) = check_config(cfg)
    assert why.rule == "fusion_schedule" and "tma or tma_cooperative" in why.reason


def test_a_residual_alone_builds_on_no_smem():
    assert rules(KernelConfig(epilogue=Epilogue(residual=True), **NO_SMEM)) == []


def test_sourceless_fusions_are_valid():
    assert rules(KernelConfig(epilogue=Epilogue.parse("bias+silu"), epilogue_source=False)) == []


@pytest.mark.parametrize("field,value", [("epilogue", "bias"), ("scaling", "rowcol"),
                                         ("epilogue", Epilogue(activation="tanh"))])
def test_operation_values_are_checked(field, value):
    assert rules(dataclasses.replace(FP8, **{field: value})) == ["operation"]


def test_kernel_and_problem_must_agree_on_the_operation():
    problem = Problem(256, 256, 256, epilogue=Epilogue.parse("bias+silu"))
    (why,) = check_pair(KernelConfig(), problem)
    assert why.rule == "problem_mismatch" and "epilogue" in why.reason
    assert check_pair(KernelConfig(epilogue=problem.epilogue), problem) == []
    fp8 = Problem(256, 256, 256, dtype_a=DType.E4M3, dtype_b=DType.E4M3, scaling=Scaling.TENSOR)
    assert "scaling" in check_pair(FP8, fp8)[0].reason


def test_bias_and_column_scales_take_a_tile_row_of_shared_memory_each():
    plain = smem_usage(KernelConfig()).epilogue_bytes
    assert smem_usage(KernelConfig(epilogue=Epilogue.parse("bias+silu"))).epilogue_bytes == plain + 128 * 2
    assert smem_usage(KernelConfig(epilogue=Epilogue.parse("silu"))).epilogue_bytes == plain
    rowcol = dataclasses.replace(FP8, scaling=Scaling.ROWCOL, epilogue=Epilogue(bias=True))
    assert smem_usage(rowcol).epilogue_bytes == smem_usage(FP8).epilogue_bytes + 128 * 2 + 128 * 4
    # the common 128x128 cooperative tile keeps its six stages and stays valid with a bias
    assert smem_usage(KernelConfig(epilogue=Epilogue.parse("bias+gelu"))).stages == 6
    assert rules(KernelConfig(epilogue=Epilogue.parse("bias+gelu"))) == []
    assert rules(KernelConfig(kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA,
                              tile_m=64, epilogue=Epilogue.parse("bias"))) == []
