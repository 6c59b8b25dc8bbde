"""Rules of the fp8 grouped operation: e4m3 with block-wise scales and a bf16 D is built (the
ptr-array FP8Blockwise mainloop, in the two tiles it builds without spills); every other fp8
grouping is refused with a reason."""

import dataclasses

import pytest

from cutlass_tune.space import (
    DType,
    Epilogue,
    EpilogueSchedule,
    Grouping,
    KernelConfig,
    KernelSchedule,
    Problem,
    Scaling,
    check_config,
    check_problem,
    smem_usage,
)

FP8_BLOCKWISE = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, scaling=Scaling.BLOCKWISE, grouping=Grouping.GROUPED)
COOP = KernelConfig(**FP8_BLOCKWISE, tile_k=128)
PING = KernelConfig(**FP8_BLOCKWISE, tile_k=128, tile_m=64, epilogue_source=False,
                    kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA)


def rules(cfg):
    return [r.rule for r in check_config(cfg)]


def test_blockwise_e4m3_grouped_kernels_are_valid():
    assert check_config(COOP) == []
    assert check_config(PING) == []
    assert check_config(dataclasses.replace(COOP, cluster_m=2)) == []
    assert check_config(dataclasses.replace(PING, cluster_n=2)) == []
    # CUTLASS 4.2's block-wise builder (dense and ptr-array) takes no fixed stage count
    assert rules(dataclasses.replace(PING, cluster_n=2, stages=4)) == ["blockwise_stages"]


@pytest.mark.parametrize("change", [
    dict(scaling=Scaling.ROWCOL),
    dict(scaling=Scaling.TENSOR),
    dict(scaling=Scaling.NONE),
    dict(dtype_a=DType.E5M2, dtype_b=DType.E5M2),
    dict(dtype_c=DType.F16, dtype_d=DType.F16),
    dict(epilogue=Epilogue.parse("bias")),
])
def test_every_other_fp8_grouping_is_refused_with_a_reason(change):
    cfg = dataclasses.replace(COOP, **change)
    refused = [r for r in check_config(cfg) if r.rule == "grouped_operation"]
    assert len(refused) == 1, check_config(cfg)
    assert "fp8" in refused[0].reason or "epilogue" in refused[0].reason


@pytest.mark.parametrize("change, rule", [
    (dict(tile_k=64), "blockwise_tile"),        # the scales apply every 128 K
    (dict(tile_n=192), "blockwise_tile"),       # B's scales cover 128 columns
    (dict(fp8_fast_accum=True), "blockwise_schedule"),
    # nvcc: static_assert "Accumulator and scaleB must have same shape"
    (dict(tile_n=256), "blockwise_tile"),
    # nvcc: ptxas spilled 1280 bytes (the second accumulator: 2 x 128 registers a thread)
    (dict(tile_m=256), "blockwise_registers"),
])
def test_blockwise_grouped_kernels_keep_the_blockwise_mainloops_limits(change, rule):
    assert rule in rules(dataclasses.replace(COOP, **change))


def test_pingpong_128x128_spills_its_second_accumulator():
    """Guards against building a kernel ptxas spilled 1360 bytes in (2 x 128 accumulators a thread)."""
    assert rules(dataclasses.replace(PING, tile_m=128)) == ["blockwise_registers"]


def test_the_smem_model_counts_the_scales_each_stage_keeps():
    """Measured with nvcc (tests/compile/test_nvcc_grouped_blockwise.py): the scales push the
    epilogue to its next 512-byte unit."""
    assert (smem_usage(COOP).stages, smem_usage(COOP).total_bytes) == (5, 201728)
    assert (smem_usage(PING).stages, smem_usage(PING).total_bytes) == (8, 209408)


def test_a_blockwise_grouped_problem_takes_any_routed_rows_and_whole_k_blocks():
    for rows in (4097, 1):  # A's scales are K-major: no multiple of 4 rows needed
        problem = Problem.experts(8, 1536, 2048, rows, **FP8_BLOCKWISE)
        assert check_problem(problem) == [], rows
    uneven = Problem.experts(4, 512, 7168, 5, group_rows=(0, 1, 4, 0), **FP8_BLOCKWISE)
    assert check_problem(uneven) == []
    assert [r.rule for r in check_problem(Problem.experts(8, 1536, 2048 + 64, 64, **FP8_BLOCKWISE))] == [
        "blockwise_shape"]


@pytest.mark.parametrize("change", [dict(scaling=Scaling.ROWCOL), dict(dtype_d=DType.F16), dict(scaling=Scaling.NONE)])
def test_other_fp8_grouped_problems_are_refused(change):
    problem = Problem.experts(8, 1536, 2048, 64, **{**FP8_BLOCKWISE, **change})
    assert "grouped_operation" in [r.rule for r in check_problem(problem)]
