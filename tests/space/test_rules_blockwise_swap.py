"""The A/B swap of dense block-wise fp8 kernels (`swap_ab` with block-wise scales): the kernel's tile
M runs over the weights' N and takes one of their scale blocks (tile M = scale_n), its tile N runs
over the tokens, one group scale per column; the smem model counts the scales so."""

import dataclasses

from cutlass_tune.space import (
    DType,
    Epilogue,
    EpilogueSchedule,
    Grouping,
    KernelConfig,
    KernelSchedule,
    Scaling,
    check_config,
    smem_usage,
)
from cutlass_tune.space.cutlass import _round_up

SWAP = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128, scaling=Scaling.BLOCKWISE, swap_ab=True,
            epilogue_source=False)
PINGPONG = dict(SWAP, tile_m=64, scale_n=64, kernel_schedule=KernelSchedule.PINGPONG,
                epilogue_schedule=EpilogueSchedule.TMA)
COOPERATIVE = dict(SWAP, tile_m=128, scale_n=128)


def _rules(cfg):
    return [r.rule for r in check_config(cfg)]


def test_swapped_blockwise_tiles_are_weight_blocks_by_token_columns():
    for n in (16, 32, 64, 128):
        assert _rules(KernelConfig(**PINGPONG, tile_n=n)) == []
        assert _rules(KernelConfig(**COOPERATIVE, tile_n=n)) == []
        assert _rules(KernelConfig(**COOPERATIVE, tile_n=n, cluster_m=2)) == []
    # tile N need not be a scale block any more: the unswapped kernel refuses 64 at scale_n 128
    assert _rules(KernelConfig(**{**COOPERATIVE, "swap_ab": False}, tile_n=64)) == ["blockwise_tile"]


def test_swapped_tile_m_must_be_the_scale_block():
    assert _rules(KernelConfig(**{**PINGPONG, "scale_n": 128}, tile_n=32)) == ["blockwise_tile"]
    assert _rules(KernelConfig(**{**COOPERATIVE, "scale_n": 64}, tile_n=32)) == ["blockwise_tile"]
    assert _rules(KernelConfig(**{**PINGPONG, "scale_n": 32}, tile_n=32)) == ["blockwise_tile"]


def test_swapped_tile_n_is_one_of_the_widths_nvcc_built():
    for n in (48, 96, 256):
        assert _rules(KernelConfig(**PINGPONG, tile_n=n)) == ["blockwise_tile"]


def test_swapped_blockwise_keeps_the_mainloops_limits():
    # two fp32 accumulators of a 128x128 tile in one warpgroup: 256 registers a thread
    pingpong_128 = KernelConfig(**{**PINGPONG, "tile_m": 128, "scale_n": 128}, tile_n=128)
    assert _rules(pingpong_128) == ["blockwise_registers"]
    assert _rules(dataclasses.replace(pingpong_128, tile_n=64)) == []
    assert _rules(KernelConfig(**PINGPONG, tile_n=32, stages=8)) == ["blockwise_stages"]
    assert "blockwise_schedule" in _rules(KernelConfig(**PINGPONG, tile_n=32, fp8_fast_accum=True))


def test_swapped_blockwise_is_dense_and_takes_a_bias_and_an_activation_at_most():
    assert _rules(KernelConfig(**PINGPONG, tile_n=32, epilogue=Epilogue.parse("bias+silu"))) == []
    residual = KernelConfig(**{**PINGPONG, "epilogue_source": True}, tile_n=32, epilogue=Epilogue.parse("residual"))
    assert _rules(residual) == ["swap_ab"]
    grouped = KernelConfig(**{**COOPERATIVE, "scale_n": 128}, tile_n=128, grouping=Grouping.GROUPED)
    assert "swap_ab" in _rules(grouped)


def test_a_swapped_stage_holds_one_weight_scale_and_a_token_scale_per_column():
    """compute_stage_count_with_blockwise_scale with ScaleMsPerTile 1 and ScaleNsPerTile tile N."""
    swapped = smem_usage(KernelConfig(**PINGPONG, tile_n=32))
    assert swapped.stage_bytes == _round_up(64 * 128 + 32 * 128 + 4 * (1 + 32), 128) + 16
    unswapped = smem_usage(KernelConfig(**{**PINGPONG, "swap_ab": False}, tile_n=64))
    assert unswapped.stage_bytes == _round_up(64 * 128 * 2 + 4 * (64 + 1), 128) + 16


def test_the_swap_names_the_kernel_and_applies_to_dense_blockwise_only():
    cfg = KernelConfig(**PINGPONG, tile_n=32)
    assert cfg.name.endswith("_nosrc_swapab_sn64_scale-blockwise")
    assert KernelConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.hash != dataclasses.replace(cfg, swap_ab=False).hash
    [swap] = [k for k in KernelConfig.knobs if k.name == "swap_ab"]
    assert swap.applies_to(cfg)
    assert not swap.applies_to(dataclasses.replace(cfg, grouping=Grouping.GROUPED))
