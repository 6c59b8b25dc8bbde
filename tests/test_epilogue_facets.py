"""Every stage's epilogue tables derive from space's (`ACTIVATIONS`, `NODES`): render's C++
functors and visitors, torch's functions, gradients and node meanings, the recognisers of capture,
patch and the Inductor pass, cuBLASLt's activations. A new activation is its entry (and enum
member) in space/_epilogue.py; a stage with its own copy would fail here."""

import functools

import pytest
import torch
import torch.nn.functional as F

from cutlass_tune import render
from cutlass_tune._torch import (
    ACTIVATION,
    ACTIVATION_GRAD,
    NODE_GRAD,
    NODE_TORCH,
    activation_of_op,
    apply_nodes,
    backward_nodes,
)
from cutlass_tune.measurement import LT_ACTIVATIONS, Baseline
from cutlass_tune.runtime._patch import activation_of_module
from cutlass_tune.space import ACTIVATIONS, NODES, Activation, Epilogue, Grouping, NodeKind, Operation, Pair


def test_render_spells_each_activation_and_builds_each_rendered_node_from_the_tables():
    assert render._ACTIVATION == {a: f.cutlass for a, f in ACTIVATIONS.items()}
    assert set(render.VISITORS) == set(NodeKind)
    for kind, facets in NODES.items():
        # The GLU pair is a collective epilogue of its own (render._GLU), not a visitor.
        built = render.VISITORS[kind] is not None or (kind is NodeKind.GLU and render._GLU[Pair.INTERLEAVED][0])
        assert built == bool(facets.rendered), kind


@pytest.mark.parametrize("activation", list(Activation))
def test_torch_computes_and_differentiates_each_activation_as_its_entry_names(activation):
    facets = ACTIVATIONS[activation]
    z = torch.randn(64, dtype=torch.float64, requires_grad=True)
    expected = getattr(F, facets.torch)(z, **dict(facets.kwargs)) if facets.torch else z
    assert torch.equal(ACTIVATION[activation](z), expected)
    if activation is Activation.NONE:
        assert activation not in ACTIVATION_GRAD
        return
    grad = torch.randn_like(z)
    (autograd,) = torch.autograd.grad(expected, z, grad)
    torch.testing.assert_close(ACTIVATION_GRAD[activation](grad, z.detach()), autograd)


@pytest.mark.parametrize("activation", [a for a in Activation if a is not Activation.NONE])
def test_each_recogniser_finds_the_activations_its_entry_names(activation):
    facets = ACTIVATIONS[activation]
    kwargs = dict(facets.kwargs)
    for op in facets.aten:
        assert activation_of_op(op, kwargs.get("approximate", "none")) is activation
    for name in facets.modules:
        module = type(name, (torch.nn.Module,), dict(kwargs))()
        assert activation_of_module(module) is activation, name
    torch_fn = getattr(F, facets.torch)
    for dotted in facets.functions:
        assert activation_of_module(functools.reduce(getattr, dotted.split(".")[1:], torch)) is activation
    assert activation_of_module(functools.partial(torch_fn, **kwargs) if kwargs else torch_fn) is activation


def test_a_module_working_in_place_is_not_recognised():
    assert activation_of_module(torch.nn.ReLU(inplace=True)) is None
    assert activation_of_module(torch.nn.ReLU()) is Activation.RELU
    assert activation_of_module(torch.nn.GELU(approximate="tanh")) is Activation.GELU_TANH
    assert activation_of_module(torch.nn.Tanh()) is None


def test_cublaslt_activations_and_its_baseline_come_from_the_table():
    assert LT_ACTIVATIONS == {a for a, f in ACTIVATIONS.items() if f.cublaslt}
    for activation in Activation:
        bias_act = Operation(epilogue=Epilogue(bias=True, activation=activation))
        assert Baseline.CUBLASLT.applies(bias_act) is (activation in LT_ACTIVATIONS)
    assert not Baseline.CUBLASLT.applies(Operation(epilogue=Epilogue(bias=True, activation=Activation.RELU,
                                                                     residual=True)))


def test_the_inductor_pass_traces_every_activation():
    from cutlass_tune.runtime._inductor import _TRACED

    assert set(_TRACED) == set(Activation) - {Activation.NONE}


def test_torch_has_every_node_kind():
    assert set(NODE_TORCH) == set(NodeKind) and set(NODE_GRAD) == set(NodeKind)


@pytest.mark.parametrize("epilogue", [
    Epilogue(bias=True, activation=Activation.GELU, residual=True),
    Epilogue(bias=True, activation=Activation.SILU, gated=True),
    Epilogue(activation=Activation.SILU, pair=Pair.INTERLEAVED, row_scale=True),
    Epilogue(bias=True, activation=Activation.GELU_TANH, pair=Pair.SPLIT),
], ids=lambda e: e.name)
def test_each_node_s_gradient_is_its_torch_meaning_s(epilogue):
    m, n = 6, 32
    generator = torch.Generator().manual_seed(0)
    value = torch.randn(m, n, dtype=torch.float64, generator=generator, requires_grad=True)
    inputs = {o.name: torch.randn(o.shape, dtype=torch.float64, generator=generator, requires_grad=True)
              for o in epilogue.operands(m, n)}
    nodes = [node for node in epilogue.tree().walk() if node.kind is not NodeKind.ACCUMULATOR]
    out = apply_nodes(nodes, value, inputs)
    assert out.shape == epilogue.output_shape(m, n)
    grad = torch.randn_like(out)
    wanted = [value, *inputs.values()]
    expected = torch.autograd.grad(out, wanted, grad)
    detached = {k: v.detach() for k, v in inputs.items()}
    got, grads = backward_nodes(nodes, grad, value.detach, detached, needs=tuple(inputs))
    torch.testing.assert_close(got, expected[0])
    for name, want in zip(inputs, expected[1:]):
        torch.testing.assert_close(grads[name], want, msg=name)


def test_grouped_kernels_render_only_what_their_nodes_say():
    grouped = {kind for kind, facets in NODES.items() if Grouping.GROUPED in facets.rendered}
    assert grouped == {NodeKind.ACCUMULATOR, NodeKind.SCALE, NodeKind.ACTIVATION, NodeKind.GLU}


_NEW_ACTIVATION = '''
import os

import torch
import torch.nn.functional as F

from cutlass_tune import _torch, render
from cutlass_tune.measurement import LT_ACTIVATIONS
from cutlass_tune.runtime._inductor import _TRACED
from cutlass_tune.runtime._patch import activation_of_module
from cutlass_tune.space import Activation, Epilogue, KernelConfig, Problem, check_problem

assert render.__file__.startswith(os.getcwd())  # the patched copy
a = Activation("hardswish")
assert Epilogue.parse("bias+hardswish").activation is a
assert check_problem(Problem(256, 256, 256, epilogue=Epilogue(bias=True, activation=a))) == []
assert "thread::HardSwish" in render.fusion(KernelConfig(epilogue=Epilogue(bias=True, activation=a)))[0]
z = torch.randn(64, dtype=torch.float64, requires_grad=True)
assert torch.equal(_torch.ACTIVATION[a](z), F.hardswish(z))
grad = torch.randn_like(z)
(want,) = torch.autograd.grad(F.hardswish(z), z, grad)
torch.testing.assert_close(_torch.ACTIVATION_GRAD[a](grad, z.detach()), want)
assert _torch.activation_of_op("hardswish_") is a
assert activation_of_module(torch.nn.Hardswish()) is a and activation_of_module(F.hardswish) is a
assert a in _TRACED and a not in LT_ACTIVATIONS
print("ok")
'''


def test_a_new_activation_is_its_enum_member_and_one_entry(tmp_path):
    """A copy of the package whose space/_epilogue.py alone gains Hardswish: render, torch, its
    gradient, the recognisers and the Inductor pass all know it."""
    import pathlib
    import shutil
    import subprocess
    import sys

    root = pathlib.Path(render.__file__).resolve().parent.parent
    shutil.copytree(root / "cutlass_tune", tmp_path / "cutlass_tune", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(root / "templates", tmp_path / "templates")
    module = tmp_path / "cutlass_tune" / "space" / "_epilogue.py"
    text = module.read_text()
    member, entry = '    SILU = "silu"\n', "    Activation.SILU: ActivationFacets("
    assert member in text and entry in text
    module.write_text(text.replace(member, member + '    HARDSWISH = "hardswish"\n').replace(entry, (
        '    Activation.HARDSWISH: ActivationFacets(\n'
        '        cutlass="cutlass::epilogue::thread::HardSwish", torch="hardswish", backward="hardswish_backward",\n'
        '        aten=("hardswish",), modules=("Hardswish",), functions=("torch.nn.functional.hardswish",)),\n'
        + entry)))
    done = subprocess.run([sys.executable, "-c", _NEW_ACTIVATION], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
