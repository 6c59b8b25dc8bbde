"""Block-wise fp8 scaling's rules: what CUTLASS 4.2's FP8Blockwise mainloop builds, the problems it
takes, and the smem model counting the scales each stage holds."""

from cutlass_tune.space import (
    DType,
    EpilogueSchedule,
    Grouping,
    KernelConfig,
    KernelSchedule,
    Operation,
    Problem,
    Scaling,
    check_config,
    check_problem,
    smem_usage,
)
from cutlass_tune.space._rules import scale_n_problem
from cutlass_tune.space.cutlass import _round_up

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


NARROW = dict(BW, tile_m=64, kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA,
              epilogue_source=False)


def test_a_narrower_b_scale_granularity_takes_tiles_of_its_width():
    for width in (64, 32):
        assert _rules(KernelConfig(**NARROW, tile_n=width, scale_n=width)) == []
        assert _rules(KernelConfig(**NARROW, tile_n=128, scale_n=width)) == ["blockwise_tile"]
    assert _rules(KernelConfig(**BW, tile_n=64, scale_n=64)) == []  # cooperative 128x64
    assert _rules(KernelConfig(**NARROW, tile_n=64, scale_n=32)) == ["blockwise_tile"]


def test_scale_n_is_for_dense_blockwise_kernels_and_128_64_or_32():
    assert _rules(KernelConfig(tile_n=64, scale_n=64)) == ["blockwise_scale_n"]
    assert "blockwise_scale_n" in _rules(KernelConfig(**{**BW, "scaling": Scaling.ROWCOL}, scale_n=64, tile_n=64))
    grouped = KernelConfig(**BW, tile_n=64, scale_n=64, grouping=Grouping.GROUPED)
    assert "blockwise_scale_n" in _rules(grouped)
    assert scale_n_problem(96) and scale_n_problem(True) and not scale_n_problem(64)


def test_each_stage_counts_one_b_scale_per_scale_n_columns():
    # A 64x64 tile at scale_n 64 holds one B scale a stage, as 64x128 does at 128, not 64 // 128 = 0.
    narrow = smem_usage(KernelConfig(**NARROW, tile_n=64, scale_n=64))
    assert narrow.stage_bytes == _round_up(64 * 128 * 2 + 4 * (64 + 1), 128) + 16


def test_scale_n_names_the_kernel_and_keeps_the_hash_of_128():
    cfg = KernelConfig(**NARROW, tile_n=64, scale_n=64)
    assert "_sn64" in cfg.name and "_sn" not in KernelConfig(**BW).name
    assert "scale_n" not in KernelConfig(**BW).to_dict() and cfg.to_dict()["scale_n"] == 64
    assert KernelConfig.from_dict(cfg.to_dict()) == cfg


def test_blockwise_kernels_take_automatic_stages_only():
    """Guards against fixed stage counts, which CUTLASS 4.2's block-wise builder cannot compile
    (the suite's 64x128x128 4x2 s2 failed so; 1,248 of its auto space's 1,488 were such)."""
    assert _rules(KernelConfig(**BW, stages=4)) == ["blockwise_stages"]
    assert _rules(KernelConfig(**NARROW, tile_n=64, scale_n=64, stages=12)) == ["blockwise_stages"]
    assert _rules(KernelConfig(tile_k=64, stages=4)) == []
