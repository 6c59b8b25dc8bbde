import dataclasses

import jinja2
import pytest

from cutlass_tune import render
from cutlass_tune.errors import RenderError
from cutlass_tune.render import kernel_symbol, render_unit
from cutlass_tune.space import (
    DType,
    Epilogue,
    EpilogueSchedule,
    Grouping,
    KernelConfig,
    KernelSchedule,
    Layout,
    Scaling,
    TileScheduler,
)

COOP = KernelConfig(tile_n=256, cluster_m=2)


def test_renders_the_knobs():
    src = render_unit([COOP]).source
    assert "Shape<_128, _256, _64>" in src
    assert "Shape<_2, _1, _1>" in src
    assert "cutlass::gemm::KernelTmaWarpSpecializedCooperative" in src
    assert "cutlass::epilogue::TmaWarpSpecializedCooperative" in src
    assert "StageCountAutoCarveout" in src
    assert "cutlass::gemm::PersistentScheduler" in src
    assert "scheduler.splits" not in src
    assert f"int {kernel_symbol(COOP)}_run(" in src
    assert src.count('extern "C" int cutlass_tune_abi_version()') == 1


def test_fixed_stages_stream_k_and_layouts():
    cfg = dataclasses.replace(COOP, stages=4, tile_scheduler=TileScheduler.STREAM_K,
                              layout_a=Layout.COL, layout_b=Layout.ROW)
    src = render_unit([cfg]).source
    assert "StageCount<4>" in src and "StageCountAutoCarveout" not in src
    assert "cutlass::gemm::StreamKScheduler" in src and "scheduler.splits = p->splits" in src
    assert "using LayoutA = cutlass::layout::ColumnMajor;" in src
    assert "using LayoutB = cutlass::layout::RowMajor;" in src


def test_plain_kernel_gets_void_scheduler():
    cfg = KernelConfig(kernel_schedule=KernelSchedule.TMA_WS, epilogue_schedule=EpilogueSchedule.TMA)
    assert "Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, void>" in render_unit([cfg]).source


def test_unit_with_several_kernels_keeps_them_apart():
    a, b = COOP, dataclasses.replace(COOP, cluster_m=1)
    unit = render_unit([a, b])
    assert unit.symbols == (kernel_symbol(a), kernel_symbol(b))
    for sym in unit.symbols:
        assert f"namespace {sym} {{" in unit.source
    assert unit.key != render_unit([a]).key
    with pytest.raises(RenderError, match="twice"):
        render_unit([a, a])


def test_invalid_config_is_not_rendered():
    with pytest.raises(RenderError, match="cooperative_tile_m"):
        render_unit([dataclasses.replace(COOP, tile_m=64)])


@pytest.mark.parametrize("field,value", [
    ("tile_m", "128>; } int evil() { return system(\"rm -rf /\"); } //"),
    ("tile_m", 128.0),
    ("stages", True),
    ("cluster_n", "1"),
    ("kernel_schedule", "cooperative"),  # a bare string, not the enum member
    ("kernel_schedule", "cutlass::gemm::KernelTmaWarpSpecializedCooperative"),
    ("dtype_a", "cutlass::bfloat16_t"),
    ("layout_b", "cutlass::layout::RowMajor; #include </etc/passwd>"),
    ("epilogue_schedule", None),
    ("tile_scheduler", "void"),
    ("fp8_fast_accum", "true"),  # a truthy string must not pick a schedule
    ("fp8_fast_accum", 1),
    ("fp8_fast_accum", None),
    ("epilogue_tile_n", "64>, evil<int"),
    ("epilogue_tile_n", 64.0),
    ("epilogue_source", "false"),  # a truthy string must not pick the C operand
    ("epilogue_source", 0),
])
def test_hostile_values_never_reach_the_source(field, value):
    cfg = dataclasses.replace(KernelConfig(), **{field: value})
    with pytest.raises(RenderError):
        render_unit([cfg])


FP8 = KernelConfig(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128)


@pytest.mark.parametrize("schedule,epilogue,tag", [
    (KernelSchedule.COOPERATIVE, EpilogueSchedule.TMA_COOPERATIVE, "KernelTmaWarpSpecializedCooperativeFP8FastAccum"),
    (KernelSchedule.PINGPONG, EpilogueSchedule.TMA, "KernelTmaWarpSpecializedPingpongFP8FastAccum"),
    (KernelSchedule.TMA_WS, EpilogueSchedule.TMA, "KernelTmaWarpSpecializedFP8FastAccum"),
])
def test_fp8_fast_accum_picks_the_fast_accum_schedule(schedule, epilogue, tag):
    cfg = dataclasses.replace(FP8, tile_m=128 if schedule is KernelSchedule.COOPERATIVE else 64,
                              kernel_schedule=schedule, epilogue_schedule=epilogue, fp8_fast_accum=True)
    src = render_unit([cfg]).source
    assert "using ElementA = cutlass::float_e4m3_t;" in src and f"Shape<_{cfg.tile_m}, _128, _128>" in src
    assert f"    cutlass::gemm::{tag}>::CollectiveOp;" in src
    # Without fast accumulation: the plain schedule (the builder picks the promoting fp8 mainloop).
    plain = render_unit([dataclasses.replace(cfg, fp8_fast_accum=False)]).source
    assert "FP8" not in plain and "FastAccum" not in plain


def test_fp8_mixed_types_render_their_elements():
    src = render_unit([dataclasses.replace(FP8, dtype_b=DType.E5M2, dtype_c=DType.F32, dtype_d=DType.F32)]).source
    assert "using ElementA = cutlass::float_e4m3_t;" in src and "using ElementB = cutlass::float_e5m2_t;" in src
    assert "using ElementD = float;" in src


def test_fast_accum_on_16_bit_is_not_rendered():
    with pytest.raises(RenderError, match="fp8_fast_accum"):
        render_unit([KernelConfig(fp8_fast_accum=True)])


def test_templates_fail_loudly_on_missing_values():
    assert render._env.undefined is jinja2.StrictUndefined
    with pytest.raises(jinja2.UndefinedError):
        render._env.get_template("gemm_sm90_unit.cu.j2").render(abi_version=1, kernels=[{"symbol": "x"}])


def test_epilogue_tile_and_sourceless_kernel():
    pong = KernelConfig(kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA)
    src = render_unit([pong]).source
    assert "EpilogueTileAuto" in src and "using ElementC = cutlass::bfloat16_t;" in src
    assert "static_cast<const ElementC*>(p->c)" in src
    tuned = render_unit([dataclasses.replace(pong, epilogue_tile_n=64, epilogue_source=False)]).source
    assert "EpilogueTileAuto" not in tuned and "    Shape<_64, _64>," in tuned
    assert "using ElementC = void;" in tuned and "constexpr int AlignmentC = AlignmentD;" in tuned
    assert "static_cast<const ElementC*>(p->c)" not in tuned
    coop = render_unit([dataclasses.replace(COOP, epilogue_tile_n=128)]).source
    assert "    Shape<_128, _128>," in coop  # cooperative subtiles span both warpgroups' rows


def test_extended_wgmma_shapes_only_where_a_tile_needs_them():
    define = "#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED"
    wide = KernelConfig(tile_m=256, tile_n=160, epilogue_source=False)
    assert define not in render_unit([COOP]).source
    assert render_unit([wide]).source.index(define) < render_unit([wide]).source.index("#include")
    assert define in render_unit([COOP, wide]).source  # a unit with one such tile enables them


# ---- fused epilogues -------------------------------------------------------------------------
def _fused(epilogue: str, scaling: Scaling = Scaling.NONE, **fields) -> KernelConfig:
    base = FP8 if scaling is not Scaling.NONE else KernelConfig()
    return dataclasses.replace(base, epilogue=Epilogue.parse(epilogue), scaling=scaling, **fields)


def test_plain_and_residual_kernels_render_the_plain_epilogue():
    """Guards against fused epilogues changing the source (and so the cache key) of plain kernels."""
    plain = render_unit([KernelConfig()]).source
    assert "Fusion" not in plain and "fusion/operations.hpp" not in plain and "{p->alpha, p->beta}" in plain
    residual = render_unit([_fused("residual")]).source  # beta * C: the linear combination's own
    assert residual.replace(kernel_symbol(_fused("residual")), kernel_symbol(KernelConfig())) == plain


@pytest.mark.parametrize("epilogue,operation,act", [
    ("bias+silu", "LinCombPerColBiasEltAct", "SiLu"),
    ("bias+gelu", "LinCombPerColBiasEltAct", "GELU"),
    ("bias", "LinCombPerColBiasEltAct", "Identity"),
    ("gelu_tanh", "LinCombEltAct", "GELU_taylor"),
    ("relu+residual", "LinCombEltAct", "ReLu"),
])
def test_16_bit_epilogues_use_cutlass_fusion_operations(epilogue, operation, act):
    cfg = _fused(epilogue)
    src = render_unit([cfg]).source
    assert '#include "cutlass/epilogue/fusion/operations.hpp"' in src
    assert (f"using Fusion = cutlass::epilogue::fusion::{operation}<cutlass::epilogue::thread::{act}, ElementD, "
            "ElementCompute, ") in src
    assert "cutlass::epilogue::TmaWarpSpecializedCooperative, Fusion>::CollectiveOp;" in src
    assert "args.epilogue.thread.alpha = p->alpha;" in src and "args.epilogue.thread.beta = p->beta;" in src
    assert ("args.epilogue.thread.bias_ptr = static_cast<const ElementBias*>(p->bias);" in src) is cfg.epilogue.bias


def test_sourceless_fused_kernel_passes_void_source():
    src = render_unit([_fused("bias+silu", epilogue_source=False)]).source
    assert "using ElementC = void;" in src and "ElementBias, ElementC, ElementCompute>;" in src


def test_tensor_scaled_fp8_reads_both_scales_on_the_device():
    src = render_unit([_fused("bias+gelu", Scaling.TENSOR)]).source
    assert "Sm90ScalarBroadcast<float, cute::Stride<cute::_0, cute::_0, int64_t>, 3>" in src
    assert ("{{p->alpha, 1.0f, 1.0f}, {nullptr, static_cast<const float*>(p->scale_a), "
            "static_cast<const float*>(p->scale_b)}, {}}") in src
    assert "Sm90Compute<cutlass::epilogue::thread::GELU, ElementD, ElementCompute" in src
    assert "static_cast<const ElementBias*>(p->bias)" in src and "Sm90SrcFetch" not in src


def test_rowcol_scaled_fp8_broadcasts_a_column_of_row_scales_and_a_row_of_column_scales():
    cfg = _fused("bias+silu+residual", Scaling.ROWCOL)
    values = render.template_values(cfg)
    tree = values["fusion"]
    # scale_a: M values, one per row (a column broadcast, read element by element)
    assert "Sm90ColBroadcast<0, TileShape, float, ElementCompute, cute::Stride<cute::_1, cute::_0, int64_t>, 1>" in tree
    # scale_b and bias: N values, one per column (row broadcasts)
    assert "Sm90RowBroadcast<0, TileShape, float, ElementCompute, cute::Stride<cute::_0, cute::_1, int64_t>>" in tree
    assert "Sm90RowBroadcast<0, TileShape, ElementBias, ElementCompute" in tree
    assert "Sm90SrcFetch<ElementC>" in tree and tree.startswith(
        "cutlass::epilogue::fusion::Sm90EVT<cutlass::epilogue::fusion::Sm90Compute<cutlass::epilogue::thread::SiLu, "
        "ElementD,")
    (statement,) = values["fusion_arguments"]
    assert statement.startswith("args.epilogue.thread = {") and statement.count("{") == statement.count("}")
    for pointer in ("p->scale_a", "p->scale_b", "p->bias", "p->alpha", "p->beta"):
        assert statement.count(pointer) == 1, pointer
    # a compute node each: alpha, scale_b, scale_a, + bias, beta * C +, the activation
    assert tree.count("Sm90EVT<") == 6


def test_rowcol_without_activation_ends_in_an_identity_to_d():
    tree = render.template_values(_fused("none", Scaling.ROWCOL))["fusion"]
    assert "Sm90Compute<cutlass::epilogue::thread::Identity, ElementD," in tree
    assert "ElementBias" not in tree and "SrcFetch" not in tree


@pytest.mark.parametrize("scaling", [Scaling.NONE, Scaling.TENSOR, Scaling.ROWCOL])
def test_gated_kernels_multiply_the_activated_source_by_the_product(scaling):
    values = render.template_values(_fused("bias+gelu_tanh+gated", scaling))
    tree, (statement,) = values["fusion"], values["fusion_arguments"]
    fusion = "cutlass::epilogue::fusion::"
    # the root: D = (activation of C) times (s * acc + bias); the activation never sees the product
    assert tree.startswith(f"{fusion}Sm90EVT<{fusion}Sm90Compute<cutlass::multiplies, ElementD, ElementCompute, "
                           "cutlass::FloatRoundStyle::round_to_nearest>, "
                           f"{fusion}Sm90EVT<{fusion}Sm90Compute<cutlass::epilogue::thread::GELU_taylor, "
                           f"ElementCompute, ElementCompute, cutlass::FloatRoundStyle::round_to_nearest>, "
                           f"{fusion}Sm90SrcFetch<ElementC>>, {fusion}Sm90EVT<{fusion}Sm90Compute<cutlass::plus,")
    assert tree.count("GELU_taylor") == 1 and tree.count("Sm90SrcFetch") == 1 and "homogeneous_multiply_add" not in tree
    assert values["element_c"] == "cutlass::bfloat16_t"
    assert statement.startswith("args.epilogue.thread = {") and statement.count("{") == statement.count("}")
    assert "p->beta" not in statement and statement.count("p->alpha") == 1 and statement.count("p->bias") == 1


@pytest.mark.parametrize("field,value", [
    ("epilogue", "bias+silu"),  # a name, not an Epilogue
    ("epilogue", Epilogue(activation="SiLu>; evil<int")),
    ("epilogue", Epilogue(bias="true")),
    ("scaling", "rowcol"),
    ("scaling", None),
])
def test_hostile_operations_never_reach_the_source(field, value):
    with pytest.raises(RenderError):
        render_unit([dataclasses.replace(FP8, **{field: value})])


GROUPED = KernelConfig(grouping=Grouping.GROUPED)
GROUPED_PINGPONG = KernelConfig(grouping=Grouping.GROUPED, tile_m=64, kernel_schedule=KernelSchedule.PINGPONG,
                                epilogue_schedule=EpilogueSchedule.TMA, layout_b=Layout.ROW)


def test_grouped_configs_render_the_ptr_array_kernels():
    src = render_unit([GROUPED, GROUPED_PINGPONG]).source
    assert src.count("cutlass::gemm::GroupProblemShape<Shape<int, int, int>>") == 2
    assert "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>" in src
    assert "cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>" in src
    assert "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong>" in src
    # both ptr-array epilogues run on two warpgroups, as the kernels static_assert
    assert "cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>" in src
    assert src.count("cutlass::gemm::GroupScheduler>") == 2
    assert src.count("GemmUniversalMode::kGrouped") == 2
    assert "LayoutA*, AlignmentA" in src and "LayoutD*, AlignmentD" in src
    assert '#include "cutlass/gemm/group_array_problem_shape.hpp"' in src
    assert "constexpr int64_t kMaxGroups = 4096;" in src
    for cfg in (GROUPED, GROUPED_PINGPONG):
        for entry in ("shared_storage_bytes", "stages", "mma_n", "workspace_size", "can_implement", "create",
                      "destroy", "initialize", "run"):
            assert f" {kernel_symbol(cfg)}_{entry}(" in src, entry


def test_sourceless_grouped_kernel_has_no_c_array():
    src = render_unit([dataclasses.replace(GROUPED, epilogue_source=False)]).source
    assert "using ElementC = void;" in src
    assert "g.c = nullptr;" in src
    assert "{ {}, nullptr, arrays.stride_d" in src


@pytest.mark.parametrize("change", [dict(kernel_schedule=KernelSchedule.TMA_WS, epilogue_schedule=EpilogueSchedule.TMA),
                                    dict(tile_scheduler=TileScheduler.STREAM_K),
                                    dict(epilogue_schedule=EpilogueSchedule.NO_SMEM),
                                    dict(epilogue=Epilogue.parse("bias"))])
def test_grouped_configs_the_ptr_array_kernels_lack_are_not_rendered(change):
    with pytest.raises(RenderError, match="grouped"):
        render_unit([dataclasses.replace(GROUPED, **change)])


def test_hostile_grouping_never_reaches_the_source():
    with pytest.raises(RenderError, match="grouping"):
        render_unit([dataclasses.replace(GROUPED, grouping="grouped); system(")])


# sha256 of units rendered before grouped kernels existed (ABI 4 struct included).
PLAIN_UNITS = [
    ([KernelConfig(tile_n=256, cluster_m=2)], "3eef4e69418873df1305753c0bc57585a39f1911932d370bdc7ebd96cc12be91"),
    ([KernelConfig(tile_m=64, kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA,
                   epilogue_source=False),
      KernelConfig(stages=4, tile_scheduler=TileScheduler.STREAM_K, layout_a=Layout.COL, layout_b=Layout.ROW)],
     "67c6d0c06f449b386368d02dd97595a2e0f499ef6402ae8dc10796f562874796"),
    ([KernelConfig(epilogue=Epilogue.parse("bias+silu"))],
     "0aa998d31e6f3c2ef4f4d0be413e2f5c2a4698817bb18da741c2c026a2be7149"),
    ([KernelConfig(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128, scaling=Scaling.ROWCOL,
                   epilogue=Epilogue.parse("bias+silu"), epilogue_source=False)],
     "aa16301600ea56f6ab5a13ea6728612718d72f1a2536657027ed91f24cf8b6dd"),
    ([KernelConfig(tile_n=160)], "46eef3f7b252c2ab619c1505e55cdf477d7ad413c867cacecf7a6d38b5fc4ced"),
    # fp8 scale trees: unchanged by the gated tree built beside them
    ([KernelConfig(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128, scaling=Scaling.ROWCOL,
                   epilogue=Epilogue.parse("bias+silu+residual"))],
     "ed43a17cb341ee0d723c4eaf19c539599507bbdfbb0ae419c1914a73d66f54ee"),
]


@pytest.mark.parametrize("configs, digest", PLAIN_UNITS)
def test_plain_units_render_byte_for_byte_as_before_grouped_kernels(configs, digest):
    """Guards against the grouped template changing plain kernels' source (and so their cache keys)."""
    assert render_unit(configs).key == digest


GROUPED_FP8 = KernelConfig(grouping=Grouping.GROUPED, dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128,
                           scaling=Scaling.BLOCKWISE)
GROUPED_FP8_PINGPONG = dataclasses.replace(GROUPED_FP8, tile_m=64, kernel_schedule=KernelSchedule.PINGPONG,
                                           epilogue_schedule=EpilogueSchedule.TMA, epilogue_source=False)


def test_blockwise_grouped_configs_render_the_ptr_array_fp8_blockwise_kernels():
    src = render_unit([GROUPED_FP8, GROUPED_FP8_PINGPONG]).source
    assert src.count("using ElementA = cutlass::float_e4m3_t;") == 2
    assert src.count("using ElementD = cutlass::bfloat16_t;") == 2
    assert "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>" in src
    assert "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise>" in src
    # both scales K-major, so that each expert's are a pointer into the caller's tensors
    assert src.count("Sm90BlockwiseScaleConfig<1, 128, 128,\n    cute::GMMA::Major::K, cute::GMMA::Major::K>") == 2
    assert src.count("ElementA, cute::tuple<LayoutA*, LayoutSFA*>, AlignmentA") == 2
    assert src.count("p.arrays.scale_a[e] = p.scale_a + begin * k_blocks;") == 2
    assert src.count("p.arrays.scale_b[e] = p.scale_b + static_cast<int64_t>(e) * n_blocks * k_blocks;") == 2
    assert src.count("arrays.scale_a, nullptr, arrays.scale_b, nullptr}") == 2
    assert src.count("p->k % kScaleBlock == 0") == 2
    assert '#include "cutlass/detail/blockwise_scale_layout.hpp"' in src


def test_hostile_scaling_of_a_grouped_kernel_never_reaches_the_source():
    for value in ("blockwise", "blockwise>; evil<int", None):
        with pytest.raises(RenderError):
            render_unit([dataclasses.replace(GROUPED_FP8, scaling=value)])
    with pytest.raises(RenderError, match="grouped"):  # valid values, not a built grouping
        render_unit([dataclasses.replace(GROUPED_FP8, scaling=Scaling.ROWCOL)])


@pytest.mark.parametrize("configs, digest", [
    ([GROUPED, GROUPED_PINGPONG], "8b49ca0644b289d7b82cc2b6f388f122b77d9027fa4b898fab46ddd90cc83aec"),
    ([dataclasses.replace(GROUPED, epilogue_source=False)],
     "70fb7a97ef4a2679cd496a75b9ca4f4c586861ee73d41d99bfb42d0414f23427"),
])
def test_16_bit_grouped_units_render_byte_for_byte_as_before_fp8_grouped_kernels(configs, digest):
    """Guards against the block-wise parts of the grouped template changing bf16 kernels' cache keys."""
    assert render_unit(configs).key == digest


def test_a_narrow_n_blockwise_kernel_reads_b_scales_per_scale_n_columns():
    narrow = KernelConfig(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128, tile_m=64, tile_n=64, scale_n=64,
                          scaling=Scaling.BLOCKWISE, kernel_schedule=KernelSchedule.PINGPONG,
                          epilogue_schedule=EpilogueSchedule.TMA, epilogue_source=False)
    src = render_unit([narrow, dataclasses.replace(narrow, tile_n=128, scale_n=128)]).source
    assert src.count("Sm90BlockwiseScaleConfig<1, 64, 128,\n    cute::GMMA::Major::MN, cute::GMMA::Major::K>") == 1
    assert src.count("Sm90BlockwiseScaleConfig<1, 128, 128,\n    cute::GMMA::Major::MN, cute::GMMA::Major::K>") == 1
    assert src.count("using TileShape = Shape<_64, _64, _128>;") == 1
