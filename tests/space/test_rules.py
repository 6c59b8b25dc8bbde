import dataclasses

import pytest

from cutlass_tune.space import (
    AUTO_STAGES,
    SMEM_CAPACITY_BYTES,
    Decomposition,
    DType,
    EpilogueSchedule,
    Grouping,
    KernelConfig,
    KernelSchedule,
    Layout,
    Problem,
    RasterOrder,
    RuntimeArgs,
    TileScheduler,
    accumulator_registers,
    check_config,
    check_pair,
    check_problem,
    check_runtime,
    needs_extended_wgmma,
    smem_usage,
    wgmma_n,
)

COOP = KernelConfig()
PING = KernelConfig(tile_m=64, kernel_schedule=KernelSchedule.PINGPONG,
                    epilogue_schedule=EpilogueSchedule.TMA)


def rules(cfg):
    return {r.rule for r in check_config(cfg)}


def test_defaults_are_valid():
    assert check_config(COOP) == []
    assert check_config(PING) == []


@pytest.mark.parametrize("field,value,rule", [
    ("tile_m", 100, "tile_m"), ("tile_m", 320, "tile_m"), ("tile_m", 0, "tile_m"),
    ("tile_n", 8, "tile_n"), ("tile_n", 72, "tile_n"), ("tile_n", 272, "tile_n"),
    ("tile_k", 48, "tile_k"), ("tile_k", 512, "tile_k"),
    ("cluster_m", 3, "cluster_m"), ("cluster_n", 16, "cluster_n"),
    ("stages", 1, "stages"), ("stages", 17, "stages"), ("stages", -1, "stages"),
])
def test_value_rules(field, value, rule):
    assert rule in rules(dataclasses.replace(COOP, **{field: value}))


def test_tile_k_bytes_rule_counts_element_size():
    # 256 x 2 bytes = 512-byte rows: no smem swizzle atom covers them.
    assert "tile_k_bytes" in rules(dataclasses.replace(COOP, tile_k=256))


def test_cooperative_needs_tile_m_128():
    assert "cooperative_tile_m" in rules(dataclasses.replace(COOP, tile_m=64))
    assert "cooperative_tile_m" in rules(dataclasses.replace(COOP, tile_m=192))
    assert "cooperative_tile_m" not in rules(dataclasses.replace(COOP, tile_m=256, tile_n=64))


def test_cluster_at_most_8_ctas():
    assert "cluster_size" in rules(dataclasses.replace(COOP, cluster_m=4, cluster_n=4))
    assert "cluster_size" not in rules(dataclasses.replace(COOP, cluster_m=4, cluster_n=2))


def test_stream_k_only_with_cooperative():
    assert "stream_k_schedule" in rules(dataclasses.replace(PING, tile_scheduler=TileScheduler.STREAM_K))
    assert check_config(dataclasses.replace(COOP, tile_scheduler=TileScheduler.STREAM_K)) == []


def test_epilogue_must_pair_with_schedule():
    assert "epilogue_pairing" in rules(dataclasses.replace(COOP, epilogue_schedule=EpilogueSchedule.TMA))
    assert "epilogue_pairing" in rules(dataclasses.replace(PING, epilogue_schedule=EpilogueSchedule.TMA_COOPERATIVE))
    assert check_config(dataclasses.replace(COOP, epilogue_schedule=EpilogueSchedule.NO_SMEM)) == []


def test_fixed_stages_must_fit_in_smem():
    # 128x128x64 bf16: 32784 bytes a stage; six fit beside the epilogue, seven do not.
    assert check_config(dataclasses.replace(COOP, stages=6)) == []
    assert "smem_capacity" in rules(dataclasses.replace(COOP, stages=7))


def test_plain_kernel_epilogue_reuses_mainloop_smem():
    # Non-persistent: epilogue and mainloop tiles share a union, so a 7th stage fits.
    plain = KernelConfig(kernel_schedule=KernelSchedule.TMA_WS, epilogue_schedule=EpilogueSchedule.TMA)
    assert check_config(dataclasses.replace(plain, stages=7)) == []
    assert "smem_capacity" in rules(dataclasses.replace(plain, stages=8))


def test_auto_stages_need_two():
    big = dataclasses.replace(COOP, tile_m=256, tile_n=256, tile_k=128)
    assert smem_usage(big).stages == 1
    assert "smem_stages" in rules(big)


def test_auto_stages_follow_cutlass_carveout():
    # Figures read from sizeof(SharedStorage) and DispatchPolicy::Stages of compiled kernels.
    assert smem_usage(COOP).stages == 6
    assert smem_usage(dataclasses.replace(COOP, tile_n=256)).stages == 4
    for cfg in (COOP, dataclasses.replace(COOP, tile_n=256)):
        assert smem_usage(cfg).total_bytes <= SMEM_CAPACITY_BYTES


def test_unsupported_types_rejected():
    assert "dtype_inputs" in rules(dataclasses.replace(COOP, dtype_a=DType.F32, dtype_b=DType.F32))
    assert "dtype_inputs" in rules(dataclasses.replace(COOP, dtype_b=DType.F16))
    assert "dtype_inputs" in rules(dataclasses.replace(COOP, dtype_b=DType.E4M3))  # mixed width
    assert "dtype_output" in rules(dataclasses.replace(COOP, dtype_c=DType.F16))
    assert "dtype_accumulator" in rules(dataclasses.replace(COOP, dtype_acc=DType.BF16))
    assert "arch" in rules(dataclasses.replace(COOP, arch="sm100a"))


def test_problem_shape_and_alignment():
    assert check_problem(Problem(4096, 4096, 4096)) == []
    assert [r.rule for r in check_problem(Problem(0, 16, 16))] == ["shape"]
    why = check_problem(Problem(64, 64, 100))
    assert {r.rule for r in why} == {"tma_alignment"} and "K=100" in why[0].reason
    # Column-major A puts M on the contiguous axis.
    assert check_problem(Problem(100, 64, 64, layout_a=Layout.COL))[0].reason.startswith("M=100")
    assert check_problem(Problem(64, 100, 64))[0].reason.startswith("N=100")  # D is row-major
    assert check_problem(Problem(64, 64, 64, dtype_d=DType.F32)) == []
    assert check_problem(Problem(64, 64, 64, dtype_a=DType.E4M3, dtype_b=DType.BF16))[0].rule == "dtype_inputs"


def test_pair_must_match():
    assert check_pair(COOP, Problem(64, 64, 64)) == []
    assert check_pair(COOP, Problem(64, 64, 64, layout_b=Layout.ROW))[0].rule == "problem_mismatch"


def test_runtime_rules():
    sk = dataclasses.replace(COOP, tile_scheduler=TileScheduler.STREAM_K)
    assert check_runtime(COOP, RuntimeArgs(swizzle=8)) == []
    assert check_runtime(COOP, RuntimeArgs(swizzle=3))[0].rule == "swizzle"
    assert check_runtime(COOP, RuntimeArgs(splits=2))[0].rule == "stream_k_args"
    assert check_runtime(sk, RuntimeArgs(splits=2, decomposition=Decomposition.SPLIT_K)) == []
    assert check_runtime(sk, RuntimeArgs(splits=2, decomposition=Decomposition.DATA_PARALLEL))


def test_name_and_hash_are_stable():
    assert COOP.name == "bf16_tn_128x128x64_c1x1_sauto_cooperative_tma_cooperative_persistent"
    assert COOP.hash == KernelConfig().hash
    assert COOP.hash != dataclasses.replace(COOP, stages=4).hash
    assert KernelConfig.from_dict(COOP.to_dict()) == COOP
    assert AUTO_STAGES == 0


FP8 = KernelConfig(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128, fp8_fast_accum=True)


def test_fp8_configs_are_valid_with_either_accumulation():
    assert check_config(FP8) == []
    assert check_config(dataclasses.replace(FP8, fp8_fast_accum=False)) == []
    ping = dataclasses.replace(FP8, tile_m=64, kernel_schedule=KernelSchedule.PINGPONG,
                               epilogue_schedule=EpilogueSchedule.TMA)
    assert check_config(ping) == []
    assert check_config(dataclasses.replace(FP8, tile_scheduler=TileScheduler.STREAM_K)) == []


def test_fp8_allows_e5m2_and_fp8_mixes_with_any_16_or_32_bit_output():
    for a, b in [(DType.E5M2, DType.E5M2), (DType.E4M3, DType.E5M2), (DType.E5M2, DType.E4M3)]:
        assert check_config(dataclasses.replace(FP8, dtype_a=a, dtype_b=b)) == []
    for d in (DType.F16, DType.F32):
        assert check_config(dataclasses.replace(FP8, dtype_c=d, dtype_d=d)) == []
    assert "dtype_output" in rules(dataclasses.replace(FP8, dtype_c=DType.E4M3, dtype_d=DType.E4M3))


@pytest.mark.parametrize("layouts", [(Layout.COL, Layout.COL), (Layout.ROW, Layout.ROW), (Layout.COL, Layout.ROW)])
@pytest.mark.parametrize("fast", [False, True])
def test_fp8_needs_tn(layouts, fast):
    cfg = dataclasses.replace(FP8, layout_a=layouts[0], layout_b=layouts[1], fp8_fast_accum=fast)
    why = check_config(cfg)
    assert [r.rule for r in why] == ["fp8_layout"] and "layout tn" in why[0].reason


def test_fast_accum_needs_fp8():
    why = check_config(dataclasses.replace(COOP, fp8_fast_accum=True))
    assert [r.rule for r in why] == ["fp8_fast_accum"] and "fp8 inputs only" in why[0].reason


@pytest.mark.parametrize("value", ["true", 1, None])
def test_fast_accum_must_be_a_bool(value):
    assert rules(dataclasses.replace(FP8, fp8_fast_accum=value)) == {"fp8_fast_accum"}


def test_fp8_tile_k_counts_bytes_and_promotion_steps():
    # 32 fp8 elements = 32 bytes: below the smallest (64-byte) swizzle row.
    assert rules(dataclasses.replace(FP8, tile_k=32)) == {"tile_k_bytes"}
    assert check_config(dataclasses.replace(FP8, tile_k=64)) == []
    # tile K 256 = 8 wgmma k-steps: fine with fast accumulation; the promoting mainloop's
    # interval of 4 is not a multiple of 8 (can_implement refused it in a compiled kernel).
    k256 = dataclasses.replace(FP8, tile_k=256, tile_n=64)
    assert check_config(k256) == []
    assert rules(dataclasses.replace(k256, fp8_fast_accum=False)) == {"fp8_promotion"}


def test_fp8_smem_counts_one_byte_per_element():
    # 128x128x128 fp8 is as many bytes per stage as 128x128x64 bf16.
    assert smem_usage(FP8).stage_bytes == smem_usage(COOP).stage_bytes
    assert smem_usage(FP8).stages == 6


def test_fp8_problems_need_tn_and_16_element_rows():
    e4m3 = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3)
    assert check_problem(Problem(4096, 4096, 4096, **e4m3)) == []
    assert check_problem(Problem(4096, 4096, 4096, dtype_a=DType.E4M3, dtype_b=DType.E5M2)) == []
    why = check_problem(Problem(64, 64, 4104, **e4m3))
    assert {r.rule for r in why} == {"tma_alignment"} and "not a multiple of 16" in why[0].reason
    assert check_problem(Problem(64, 4104, 64, **e4m3)) == []  # D (bf16) rows need 8 elements
    why = check_problem(Problem(64, 64, 64, layout_b=Layout.ROW, **e4m3))
    assert [r.rule for r in why] == ["fp8_layout"]


def test_fast_accum_field_leaves_16_bit_names_and_hashes_unchanged():
    # Regression guard: adding fp8_fast_accum must not rename or rehash existing configs.
    assert COOP.hash == "4faaee0d329d4c76"
    assert "fp8_fast_accum" not in COOP.to_dict()
    assert KernelConfig.from_dict(COOP.to_dict()) == COOP
    fast = FP8.to_dict()
    assert fast["fp8_fast_accum"] is True and KernelConfig.from_dict(fast) == FP8
    slow = dataclasses.replace(FP8, fp8_fast_accum=False)
    assert FP8.name == slow.name + "_fastaccum" and FP8.hash != slow.hash
    assert slow.name == "e4m3_bf16bf16_tn_128x128x128_c1x1_sauto_cooperative_tma_cooperative_persistent"


PONG128 = KernelConfig(kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA)


def test_epilogue_knobs_leave_existing_names_and_hashes_unchanged():
    # Regression guard, as for fp8_fast_accum: defaults are left out of the hashed dict.
    assert COOP.hash == "4faaee0d329d4c76"
    assert PONG128.hash == "ad336140d59765b8"
    assert "epilogue_tile_n" not in PONG128.to_dict() and "epilogue_source" not in PONG128.to_dict()
    tuned = dataclasses.replace(PONG128, epilogue_tile_n=64, epilogue_source=False)
    assert tuned.name == PONG128.name + "_e64_nosrc"
    assert tuned.to_dict()["epilogue_tile_n"] == 64 and tuned.to_dict()["epilogue_source"] is False
    assert KernelConfig.from_dict(tuned.to_dict()) == tuned
    assert len({PONG128.hash, tuned.hash, dataclasses.replace(tuned, epilogue_source=True).hash}) == 3


@pytest.mark.parametrize("value", [8, 40, 272, -16, "64", 64.0, True, None])
def test_epilogue_tile_values(value):
    assert "epilogue_tile_n" in rules(dataclasses.replace(PONG128, epilogue_tile_n=value))


@pytest.mark.parametrize("value", ["false", 0, None])
def test_epilogue_source_must_be_a_bool(value):
    assert "epilogue_source" in rules(dataclasses.replace(PONG128, epilogue_source=value))


def test_epilogue_tile_must_divide_tile_n_and_needs_a_tma_epilogue():
    assert rules(dataclasses.replace(PONG128, tile_n=192, epilogue_tile_n=64)) == set()
    assert rules(dataclasses.replace(PONG128, tile_n=192, epilogue_tile_n=128)) == {"epilogue_tile"}
    no_smem = dataclasses.replace(PONG128, epilogue_schedule=EpilogueSchedule.NO_SMEM)
    assert rules(dataclasses.replace(no_smem, epilogue_tile_n=64)) == {"epilogue_tile"}
    assert rules(dataclasses.replace(no_smem, epilogue_source=False)) == {"epilogue_source"}


def test_epilogue_smem_follows_subtile_and_source():
    # Ping-pong 128x128 bf16: 64x32 subtiles, four C stages shared with D (16 KiB); a 64x64
    # subtile doubles that; without C only two D stages stay (8 KiB). Compiled kernels agree
    # (tests/compile/test_nvcc_epilogue.py).
    assert smem_usage(PONG128).epilogue_bytes == 16 * 1024 + 64
    assert smem_usage(dataclasses.replace(PONG128, epilogue_tile_n=64)).epilogue_bytes == 32 * 1024 + 64
    assert smem_usage(dataclasses.replace(PONG128, epilogue_source=False)).epilogue_bytes == 8 * 1024 + 64
    wide = dataclasses.replace(PONG128, epilogue_tile_n=128)  # two subtiles: three C stages
    assert smem_usage(wide).epilogue_bytes == 48 * 1024 + 48
    assert smem_usage(wide).stages == 5
    assert smem_usage(dataclasses.replace(wide, epilogue_source=False)).stages == 6


@pytest.mark.parametrize("tile_n, default_n", [
    (256, 256), (192, 192), (128, 128), (96, 96), (64, 64), (32, 32), (16, 16),
    (160, 32), (224, 32), (240, 16), (144, 16), (208, 16), (176, 16), (80, 16), (48, 16), (112, 16),
])
def test_wgmma_n_follows_the_builders_selector(tile_n, default_n):
    cfg = KernelConfig(tile_n=tile_n)
    assert wgmma_n(cfg, extended=False) == default_n
    assert wgmma_n(cfg, extended=True) == tile_n
    assert needs_extended_wgmma(cfg) is (default_n != tile_n)


@pytest.mark.parametrize("tile_m, tile_n, schedule, regs", [
    (128, 192, KernelSchedule.PINGPONG, 192),      # the 8192^3 winner: no spills
    (256, 192, KernelSchedule.COOPERATIVE, 192),   # split over two warpgroups
    (128, 208, KernelSchedule.PINGPONG, 208),      # no spills; LLaMA-33B's winner (6656 = 32 x 208)
    (256, 208, KernelSchedule.COOPERATIVE, 208),
    (128, 224, KernelSchedule.PINGPONG, 224),      # spilled 6.6 KB, 0.06 of cuBLAS
    (256, 224, KernelSchedule.COOPERATIVE, 224),
    (128, 256, KernelSchedule.TMA_WS, 256),
    (256, 256, KernelSchedule.COOPERATIVE, 256),
])
def test_accumulators_beyond_208_registers_per_thread_are_rejected(tile_m, tile_n, schedule, regs):
    epilogue = EpilogueSchedule.TMA_COOPERATIVE if schedule is KernelSchedule.COOPERATIVE else EpilogueSchedule.TMA
    cfg = KernelConfig(tile_m=tile_m, tile_n=tile_n, kernel_schedule=schedule, epilogue_schedule=epilogue,
                       stages=3)
    assert accumulator_registers(cfg) == regs
    assert ("accumulator_registers" in rules(cfg)) is (regs > 208)


def test_a_grouped_kernel_takes_swizzle_1_only():
    """Guards against sweeping swizzles that CUTLASS's group scheduler ignores (no host problem shapes)."""
    grouped = KernelConfig(grouping=Grouping.GROUPED)
    assert check_runtime(grouped, RuntimeArgs(raster=RasterOrder.ALONG_N)) == []
    assert [r.rule for r in check_runtime(grouped, RuntimeArgs(swizzle=4))] == ["grouped_swizzle"]
    assert check_runtime(KernelConfig(), RuntimeArgs(swizzle=4)) == []
