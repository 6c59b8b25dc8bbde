"""The weight gradients of MoE experts (`Grouping.GROUPED_K`, dW_e = G_e^T X_e): their operation
name, their rules, and how space files and `sweep --shapes` ask for them."""

import dataclasses

import pytest

from cutlass_tune.errors import ConfigFileError
from cutlass_tune.space import (
    DType,
    Epilogue,
    Grouping,
    Layout,
    Operation,
    OperationKind,
    Problem,
    Routing,
    Scaling,
    check_problem,
    load_space,
    space_for_shapes,
)

WGRAD = dict(layout_a=Layout.COL, layout_b=Layout.ROW, grouping=Grouping.GROUPED_K)


def test_the_operation_is_named_apart_from_the_forward_and_parses_back():
    forward = Operation(grouping=Grouping.GROUPED)
    wgrad = Operation(**WGRAD)
    assert wgrad.name == "bf16bf16bf16_nt_grouped-k" and forward.name == "bf16bf16bf16_tn_grouped"
    assert Operation.parse(wgrad.name) == wgrad and Operation.parse(forward.name) == forward
    assert Operation.from_cells(wgrad.cells()) == wgrad and Operation.from_dict(wgrad.to_dict()) == wgrad
    assert wgrad.grouped and wgrad.kind == OperationKind(Grouping.GROUPED_K) != forward.kind
    assert wgrad.kind.name == "grouped-k 16-bit"


def test_a_problem_carries_experts_rows_and_routing_like_the_forward():
    p = Problem.experts(128, 1536, 4096, 32768, routing=Routing.ZIPF, **WGRAD)
    assert p.name == "32768x1536x4096_bf16bf16bf16_nt_grouped-k_e128-zipf"
    assert sum(p.group_rows) == 32768 and p.flops == 2 * 32768 * 1536 * 4096
    assert check_problem(p) == []


def test_empty_experts_and_rows_off_any_multiple_are_valid():
    p = Problem.experts(4, 64, 64, 13, group_rows=(0, 13, 0, 0), **WGRAD)
    assert check_problem(p) == []


@pytest.mark.parametrize(("change", "words"), [
    (dict(layout_a=Layout.ROW, layout_b=Layout.COL), "layout nt"),
    (dict(layout_a=Layout.COL, layout_b=Layout.COL), "layout nt"),
    (dict(dtype_d=DType.F32), "same type"),
    (dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, scaling=Scaling.BLOCKWISE), "K-major"),
    (dict(epilogue=Epilogue.parse("silu")), "plain epilogue"),
])
def test_what_the_weight_gradient_kernel_does_not_compute_is_named(change, words):
    p = dataclasses.replace(Problem.experts(8, 256, 256, 64, **WGRAD), **change)
    reasons = [r.reason for r in check_problem(p)]
    assert any(words in r for r in reasons), reasons


def test_shapes_take_dw_for_the_weight_gradient_with_its_layout():
    sp = space_for_shapes("dw8:4096x512x1024, e8:4096x512x1024,DW4:64x64x64")
    names = [p.name for p in sp.problems]
    assert names == ["4096x512x1024_bf16bf16bf16_nt_grouped-k_e8-uniform",
                     "4096x512x1024_bf16bf16bf16_tn_grouped_e8-uniform",
                     "64x64x64_bf16bf16bf16_nt_grouped-k_e4-uniform"]
    wgrad = sp.auto_for(sp.problems[0])
    assert wgrad is not None and wgrad.operation == sp.problems[0].operation
    assert all(c.grouping is Grouping.GROUPED_K and not c.epilogue_source for c in wgrad[:50])


def test_a_space_file_block_asks_for_the_weight_gradient_by_grouping(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("problems:\n  - {experts: 8, n: 256, k: 512, rows: 4096, grouping: grouped-k, routing: zipf}\n"
                    "layouts: [tn]\nkernels: auto\n")
    (p,) = load_space(path).problems
    assert p == Problem.experts(8, 256, 512, 4096, routing=Routing.ZIPF, **WGRAD)


@pytest.mark.parametrize(("text", "key", "words"), [
    ("problems: [{m: 64, n: 64, k: 64, grouping: grouped-k}]\n", "problems.0", "give experts too"),
    ("problems: [{experts: 4, n: 64, k: 64, rows: 64, grouping: dense}]\n", "problems.0.grouping", "grouped"),
    ("problems: [{experts: 4, n: 60, k: 64, rows: 64, grouping: grouped-k}]\n", "problems", "N=60"),
])
def test_bad_weight_gradient_blocks_are_one_line(tmp_path, text, key, words):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(ConfigFileError) as err:
        load_space(path)
    assert err.value.key == key and words in err.value.problem and "\n" not in str(err.value)


def test_a_malformed_dw_shape_names_the_form():
    with pytest.raises(ConfigFileError) as err:
        space_for_shapes("dwx8:64x64x64")
    assert "dwE:ROWSxNxK" in err.value.problem
