"""cutlass_tune.nn.Linear: nn.Linear's parameters and state_dict, one operator call and a bias
add, under torch.compile; on a Hopper GPU against torch.nn.Linear."""

import copy
import io
import operator

import pytest
import torch

import cutlass_tune
from cutlass_tune.nn import Linear

from .tables import csv_table, tuned_table

OP = torch.ops.cutlass_tune.mm.default


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    table = csv_table(tmp_path_factory.mktemp("linear") / "best.csv", [("bf16", "tn", 128, 64, 32)])
    return cutlass_tune.register_table(table, key="test-linear")


def test_state_dict_keys_and_values_are_nn_linear_s(key):
    torch.manual_seed(0)
    reference = torch.nn.Linear(32, 64)
    torch.manual_seed(0)
    tuned = Linear(32, 64, table=key)
    assert isinstance(tuned, torch.nn.Linear) and tuned.table_key == key
    assert list(tuned.state_dict()) == list(reference.state_dict()) == ["weight", "bias"]
    torch.testing.assert_close(tuned.state_dict(), reference.state_dict())  # same initialization
    other = torch.nn.Linear(32, 64)
    tuned.load_state_dict(other.state_dict())
    reference.load_state_dict(tuned.state_dict())
    assert torch.equal(reference.weight, other.weight)
    assert list(Linear(32, 64, bias=False, table=key).state_dict()) == ["weight"]
    assert f"table='{key}'" in repr(tuned)


def test_from_linear_shares_the_parameters_and_the_mode(key):
    linear = torch.nn.Linear(32, 64, bias=False, dtype=torch.float64).eval()
    tuned = Linear.from_linear(linear, key)
    assert tuned.weight is linear.weight and tuned.bias is None and not tuned.training
    biased = torch.nn.Linear(32, 64)
    assert Linear.from_linear(biased, key).bias is biased.bias


@pytest.mark.parametrize("shape", [(32,), (5, 32), (2, 3, 32)])
def test_forward_and_gradients_are_nn_linear_s(key, shape):
    linear = torch.nn.Linear(32, 64, dtype=torch.float64)
    tuned = Linear.from_linear(linear, key)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    got = tuned(x)
    got.sum().backward()
    grads = x.grad, linear.weight.grad, linear.bias.grad
    x.grad = linear.weight.grad = linear.bias.grad = None
    want = linear(x)
    want.sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grads, (x.grad, linear.weight.grad, linear.bias.grad))


def test_the_module_copies_and_pickles_with_its_key(key):
    tuned = Linear(32, 64, table=key)
    x = torch.randn(4, 32)
    assert torch.equal(copy.deepcopy(tuned)(x), tuned(x))
    buffer = io.BytesIO()
    torch.save(tuned, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert loaded.table_key == key and torch.equal(loaded(x), tuned(x))


def test_forward_traces_to_one_operator_call_and_the_bias_add(key):
    tuned = Linear(32, 64, table=key)
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.compile(tuned, backend=record, fullgraph=True)(torch.randn(2, 3, 32))
    assert len(graphs) == 1
    calls = [n.target for n in graphs[0].graph.nodes if n.op in ("call_function", "call_method")]
    assert calls == ["t", OP, operator.add]  # weight.t() is a view, no copy


def test_compiled_module_matches_eager_with_gradients(key):
    tuned = Linear(32, 64, table=key)
    compiled = torch.compile(tuned, fullgraph=True)
    x = torch.randn(2, 3, 32, requires_grad=True)
    compiled(x).square().sum().backward()
    grads = x.grad, tuned.weight.grad, tuned.bias.grad
    x.grad = tuned.weight.grad = tuned.bias.grad = None
    tuned(x).square().sum().backward()
    torch.testing.assert_close(grads, (x.grad, tuned.weight.grad, tuned.bias.grad))


@pytest.mark.gpu
@pytest.mark.nvcc
def test_on_cuda_it_matches_nn_linear_eager_and_compiled():
    table = tuned_table()
    linear = torch.nn.Linear(1024, 1024, device="cuda", dtype=torch.bfloat16)
    tuned = Linear.from_linear(linear, table)
    x = torch.randn(8, 128, 1024, device="cuda", dtype=torch.bfloat16)
    want = linear(x).float()
    for module in (tuned, torch.compile(tuned, fullgraph=True)):
        got = module(x)
        assert got.dtype == torch.bfloat16 and got.shape == (8, 128, 1024)
        assert ((got.float() - want).norm() / want.norm()).item() < 1e-2
