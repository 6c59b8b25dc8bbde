import dataclasses

import jinja2
import pytest

from cutlass_tune import render
from cutlass_tune.errors import RenderError
from cutlass_tune.render import kernel_symbol, render_unit
from cutlass_tune.space import EpilogueSchedule, KernelConfig, KernelSchedule, Layout, TileScheduler

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
])
def test_hostile_values_never_reach_the_source(field, value):
    cfg = dataclasses.replace(KernelConfig(), **{field: value})
    with pytest.raises(RenderError):
        render_unit([cfg])


def test_templates_fail_loudly_on_missing_values():
    assert render._env.undefined is jinja2.StrictUndefined
    with pytest.raises(jinja2.UndefinedError):
        render._env.get_template("gemm_sm90_unit.cu.j2").render(abi_version=1, kernels=[{"symbol": "x"}])
