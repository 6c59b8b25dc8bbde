"""Block-wise fp8 scaling's rules: what CUTLASS 4.2's FP8Blockwise mainloop builds, the problems it
takes, and the smem model counting the scales each stage holds."""

from cutlass_tune.space import (
    DType,
    EpilogueSchedule,
    KernelConfig,
    KernelSchedule,
    Operation,
    Problem,
    Scaling,
    check_config,
    check_problem,
    smem_usage,
)

BW = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128, scaling=Scaling.BLOCKWISE)


def _rules(cfg):
    return [r.rule for r in check_config(cfg)]


def test_blockwise_builds_cooperative_and_pingpong_with_tile_k_128_and_tile_n_of_128():
    assert _rules(KernelConfig(**BW)) == []
    assert _rules(KernelConfig(**BW, tile_m=64, kernel_schedule=KernelSchedule.PINGPONG,
                               epilogue_schedule=EpilogueSchedule.TMA)) == []
    assert _rules(KernelConfig(**{**BW, "tile_k": 64})) == ["blockwise_tile"]
    assert _rules(KernelConfig(**BW, tile_n=64)) == ["blockwise_tile"]
    assert "blockwise_schedule" in _rules(KernelConfig(**BW, fp8_fast_accum=True))
    assert "blockwise_schedule" in _rules(KernelConfig(**BW, kernel_schedule=KernelSchedule.TMA_WS,
                                                       epilogue_schedule=EpilogueSchedule.TMA))
    assert _rules(KernelConfig(**BW, epilogue_schedule=EpilogueSchedule.NO_SMEM)) == ["fusion_schedule"]


def test_blockwise_is_for_fp8_inputs_and_whole_k_groups():
    assert "scaling_inputs" in _rules(KernelConfig(tile_k=64, scaling=Scaling.BLOCKWISE))
    fp8 = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16, scaling=Scaling.BLOCKWISE)
    assert check_problem(Problem(64, 7168, 2048, **fp8)) == []
    assert [r.rule for r in check_problem(Problem(64, 7168, 2000, **fp8))] == ["blockwise_shape"]
    assert [r.rule for r in check_problem(Problem(66, 7168, 2048, **fp8))] == ["blockwise_shape"]


def test_each_stage_counts_the_scales_it_holds():
    # compute_stage_count_with_blockwise_scale: A's tile M fp32 scales and B's tile N / 128 per stage.
    plain, blockwise = smem_usage(KernelConfig(**{**BW, "scaling": Scaling.ROWCOL})), smem_usage(KernelConfig(**BW))
    assert blockwise.stage_bytes == 128 * 128 * 2 + 640 + 16  # 516 bytes of scales: the stage rounds up to 128
    assert plain.stage_bytes < blockwise.stage_bytes


def test_blockwise_names_and_parses_as_an_operation():
    op = Operation(dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16, scaling=Scaling.BLOCKWISE)
    assert op.name.endswith("_scale-blockwise")
    assert Operation.parse(op.name) == op
