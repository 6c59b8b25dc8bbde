"""The epilogue tree and its facet tables (space/_epilogue.py): names and hashes unchanged, the
tree, D's shape and the operands each epilogue adds, and every consumer deriving from the tables
(so a new activation is one entry, and a new node kind one entry per stage's table)."""

import dataclasses

import pytest

from cutlass_tune.space import (
    ACTIVATIONS,
    GLU_BLOCK,
    NODES,
    Activation,
    Broadcast,
    DType,
    Epilogue,
    Grouping,
    KernelConfig,
    NodeKind,
    Operation,
    Pair,
    Problem,
    Role,
    Scaling,
    check_problem,
)
from cutlass_tune.space._epilogue import activation_of_aten, activation_of_module_class
from cutlass_tune.space._rules import fused, grouped_operation_problem, operation_problem

EXISTING = ["none", "bias", "relu", "gelu", "gelu_tanh", "silu", "residual", "bias+silu", "bias+gelu_tanh+residual",
            "silu+residual", "gated", "silu+gated", "bias+gelu+gated"]
"""Epilogue names stores and tables were written with before the tree."""


@pytest.mark.parametrize("name", EXISTING)
def test_every_existing_epilogue_keeps_its_name_and_fields(name):
    epilogue = Epilogue.parse(name)
    assert epilogue.name == name
    assert epilogue.pair is Pair.NONE and not epilogue.row_scale
    assert KernelConfig(epilogue=epilogue).hash == KernelConfig(
        epilogue=Epilogue(epilogue.bias, epilogue.activation, epilogue.residual, epilogue.gated)).hash


def test_the_declared_nodes_round_trip_their_names():
    for epilogue in [Epilogue(activation=Activation.SILU, pair=Pair.INTERLEAVED),
                     Epilogue(bias=True, activation=Activation.GELU, pair=Pair.SPLIT, row_scale=True),
                     Epilogue(row_scale=True)]:
        assert Epilogue.parse(epilogue.name) == epilogue
    with pytest.raises(ValueError, match="GLU pair"):
        Epilogue.parse("silu+gated+glu")


def test_the_tree_runs_from_the_accumulator_to_d():
    tree = Epilogue(bias=True, activation=Activation.RELU, residual=True).tree(Scaling.ROWCOL)
    assert tree.kinds == (NodeKind.ACCUMULATOR, NodeKind.SCALE, NodeKind.BIAS, NodeKind.RESIDUAL,
                          NodeKind.ACTIVATION)
    assert [n.scaling for n in tree.walk()][1] is Scaling.ROWCOL
    assert Epilogue(activation=Activation.SILU, gated=True).tree().kinds[-1] is NodeKind.GATE
    assert Epilogue(bias=True).tree(swap_ab=True).broadcast is Broadcast.ROW
    # Block-wise scales are the mainloop's: the epilogue scales by alpha alone.
    assert list(Epilogue().tree(Scaling.BLOCKWISE).walk())[1].scaling is Scaling.NONE


def test_d_shape_and_the_operands_come_from_the_nodes():
    m, n = 96, 64
    assert Epilogue().output_shape(m, n) == (m, n) and Epilogue().operands(m, n) == ()
    ops = {o.name: o for o in Epilogue(bias=True, residual=True).operands(m, n)}
    assert (ops["bias"].shape, ops["c"].shape, ops["c"].role) == ((n,), (m, n), Role.D)
    assert {o.name: o.shape for o in Epilogue(activation=Activation.SILU, gated=True).operands(m, n)} == {"c": (m, n)}
    glu = Epilogue(activation=Activation.SILU, pair=Pair.INTERLEAVED, row_scale=True)
    assert glu.output_shape(m, n) == (m, n // 2)
    assert {o.name: (o.shape, o.role) for o in glu.operands(m, n)} == {"row_scale": ((m,), Role.F32)}
    with pytest.raises(ValueError, match=str(2 * GLU_BLOCK)):
        glu.output_shape(m, 2 * GLU_BLOCK + 8)


def test_declared_nodes_are_refused_until_a_kernel_renders_them():
    for epilogue in (Epilogue(activation=Activation.SILU, pair=Pair.SPLIT), Epilogue(row_scale=True)):
        assert "no kernel renders it yet" in operation_problem(epilogue, Scaling.NONE)
        assert check_problem(Problem(128, 128, 128, epilogue=epilogue))


def test_a_grouped_kernel_takes_an_activation_on_16_bit_inputs_only():
    grouped = dict(grouping=Grouping.GROUPED)
    for activation in Activation:
        assert grouped_operation_problem(Operation(**grouped, epilogue=Epilogue(activation=activation))) is None
    for epilogue in (Epilogue(bias=True), Epilogue(residual=True), Epilogue(activation=Activation.SILU, gated=True)):
        assert "not built for grouped kernels" in grouped_operation_problem(Operation(**grouped, epilogue=epilogue))
    fp8 = Operation(**grouped, dtype_a=DType.E4M3, dtype_b=DType.E4M3, scaling=Scaling.BLOCKWISE,
                    epilogue=Epilogue(activation=Activation.SILU))
    assert "plain epilogue" in grouped_operation_problem(fp8)
    assert check_problem(Problem.experts(8, 256, 256, 512, epilogue=Epilogue(activation=Activation.GELU))) == []


def test_fused_reads_the_tree():
    assert not fused(Operation()) and not fused(Operation(epilogue=Epilogue(residual=True)))
    assert fused(Operation(epilogue=Epilogue(bias=True)))
    assert fused(Operation(epilogue=Epilogue(activation=Activation.RELU)))
    assert not fused(Operation(scaling=Scaling.BLOCKWISE))
    assert fused(Operation(scaling=Scaling.TENSOR))


def test_every_node_kind_and_activation_has_its_entry():
    assert set(NODES) == set(NodeKind)
    assert set(ACTIVATIONS) == set(Activation)
    assert NODES[NodeKind.GLU].rendered == {Grouping.GROUPED} and not NODES[NodeKind.ROW_SCALE].rendered
    assert all(f.backward for a, f in ACTIVATIONS.items() if a is not Activation.NONE)


def test_the_recognisers_read_the_table():
    for activation, facets in ACTIVATIONS.items():
        for op in facets.aten:
            assert activation_of_aten(op, dict(facets.kwargs)) is activation
            assert activation_of_aten(op + "_", dict(facets.kwargs)) is activation
        for name in facets.modules:
            found = activation_of_module_class((name, "Module"), lambda k, default: dict(facets.kwargs).get(k, default))
            assert found is activation, name
    assert activation_of_aten("mm", {}) is None
    assert activation_of_module_class(("Tanh", "Module"), lambda k, d: d) is None


def test_facets_are_frozen_values():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ACTIVATIONS[Activation.RELU].cutlass = "x"  # type: ignore[misc]


def test_a_space_file_s_experts_block_takes_an_activation(tmp_path):
    from cutlass_tune.space import check_pair, load_space

    path = tmp_path / "space.yaml"
    path.write_text("problems:\n  - {experts: 8, n: 1536, k: 2048, rows: 4096, epilogue: silu}\nkernels: auto\n")
    [problem] = load_space(path).problems
    assert problem.name == "4096x1536x2048_bf16bf16bf16_tn_grouped_silu_e8-uniform"
    auto = load_space(path).auto_for(problem)
    assert auto is not None
    configs = auto[:20]
    assert configs and all(check_pair(c, problem) == [] and c.epilogue == problem.epilogue for c in configs)
