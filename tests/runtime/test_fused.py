"""Fused epilogues and fp8 scales in the runtime on the CPU: the operands `matmul` checks, the
torch path it falls back to (the same math as F.linear + activation and torch._scaled_mm), the
operator `torch.ops.cutlass_tune.linear` (schema, fake shapes, gradients, torch.compile) and
`cutlass_tune.nn.Linear(activation=...)`."""

import copy
import io
import operator

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import cutlass_tune
from cutlass_tune.nn import Linear
from cutlass_tune.runtime import MatmulInputError, activation_of, operation_of, register_table, torch_gemm
from cutlass_tune.runtime._matmul import beta_of
from cutlass_tune.space import Activation, Epilogue, Scaling

from .tables import csv_table

LINEAR = torch.ops.cutlass_tune.linear.default
MM = torch.ops.cutlass_tune.mm.default
TORCH_ACTIVATIONS = {"none": lambda t: t, "relu": F.relu, "gelu": F.gelu,
                     "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    table = csv_table(tmp_path_factory.mktemp("fused") / "best.csv", [("bf16", "tn", 128, 64, 32)])
    return register_table(table, key="test-fused")


# ---- matmul's operands ---------------------------------------------------------------------
def _ab(m=8, n=16, k=32, dtype=torch.bfloat16):
    return torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype).t()


def test_operands_pose_the_epilogue_and_scaling():
    a, b = _ab()
    bias, c = torch.randn(16, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16)
    assert operation_of(a, b, torch.bfloat16) == (Epilogue(), Scaling.NONE)
    assert operation_of(a, b, torch.bfloat16, bias=bias, activation="silu") == (
        Epilogue(bias=True, activation=Activation.SILU), Scaling.NONE)
    assert operation_of(a, b, torch.bfloat16, c=c, activation=Activation.GELU_TANH)[0].name == "gelu_tanh+residual"
    fa, fb = _ab(dtype=torch.float8_e4m3fn)
    one = torch.ones((), dtype=torch.float32)
    assert operation_of(fa, fb, torch.bfloat16, scale_a=one, scale_b=one.reshape(1, 1))[1] is Scaling.TENSOR
    assert operation_of(fa, fb, torch.bfloat16, scale_a=torch.rand(8, 1), scale_b=torch.rand(1, 16),
                        bias=bias) == (Epilogue(bias=True), Scaling.ROWCOL)


@pytest.mark.parametrize(("operands", "message"), [
    ({"bias": torch.randn(8, dtype=torch.bfloat16)}, r"bias has shape \(8,\); it must be \(16,\)"),
    ({"bias": torch.randn(16)}, "bias has dtype torch.float32; it must be torch.bfloat16"),
    ({"bias": torch.randn(32, dtype=torch.bfloat16)[::2]}, "bias with strides \\(2,\\) is not contiguous"),
    ({"bias": [0.0] * 16}, "bias must be a torch.Tensor or None, not list"),
    ({"c": torch.randn(16, 8, dtype=torch.bfloat16)}, r"c has shape \(16, 8\); it must be \(8, 16\)"),
    ({"c": torch.randn(16, 8, dtype=torch.bfloat16).t()}, "c with strides \\(1, 8\\) is not contiguous"),
    ({"scale_a": torch.ones(()), "scale_b": torch.ones(())}, "scale_a and scale_b scale fp8 inputs"),
    ({"activation": "swish"}, "activation 'swish' is not one of none, relu, gelu, gelu_tanh, silu"),
])
def test_bad_operands_are_one_line_errors(operands, message):
    a, b = _ab()
    with pytest.raises(MatmulInputError, match=message) as err:
        operation_of(a, b, torch.bfloat16, **operands)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("scales", "message"), [
    ((torch.ones(()), None), "scale_b is missing: pass both scales or neither"),
    ((torch.ones(8, 1), torch.ones(16)), r"scale_b has shape \(16,\); it must be \(1, 16\)"),
    ((torch.ones(8), torch.ones(1, 16)), r"scale_a has shape \(8,\); it must be \(8, 1\)"),
    ((torch.ones(8, 1, dtype=torch.bfloat16), torch.ones(1, 16)), "scale_a has dtype torch.bfloat16; it must be "
                                                                  "torch.float32"),
    ((torch.ones((), dtype=torch.float64), torch.ones(())), "scale_a has dtype torch.float64"),
])
def test_bad_scales_are_one_line_errors(scales, message):
    a, b = _ab(dtype=torch.float8_e4m3fn)
    with pytest.raises(MatmulInputError, match=message):
        operation_of(a, b, torch.bfloat16, scale_a=scales[0], scale_b=scales[1])


def test_beta_goes_with_c_and_matmul_names_bad_operands_before_the_device():
    assert beta_of(None, None) == 0.0 and beta_of(torch.ones(1), None) == 1.0 and beta_of(torch.ones(1), 0.5) == 0.5
    with pytest.raises(MatmulInputError, match="beta 0.5 scales c, and no c was given"):
        beta_of(None, 0.5)
    a, b = _ab()
    with pytest.raises(MatmulInputError, match="bias must be a torch.Tensor or None, not str"):
        cutlass_tune.matmul(a, b, cutlass_tune.BestTable.__new__(cutlass_tune.BestTable), bias="b")
    assert activation_of("gelu_tanh") is Activation.GELU_TANH


# ---- the torch path: the same math -----------------------------------------------------------
@pytest.mark.parametrize("activation", list(TORCH_ACTIVATIONS))
@pytest.mark.parametrize("with_bias", [True, False])
def test_torch_path_is_f_linear_then_the_activation(activation, with_bias):
    x, w = torch.randn(8, 32, dtype=torch.bfloat16), torch.randn(16, 32, dtype=torch.bfloat16)
    bias = torch.randn(16, dtype=torch.bfloat16) if with_bias else None
    got = torch_gemm(x, w.t(), torch.bfloat16, bias=bias, activation=activation)
    assert torch.equal(got, TORCH_ACTIVATIONS[activation](F.linear(x, w, bias)))


def test_torch_path_residual_alpha_beta_and_float32_output():
    x, w = torch.randn(8, 32, dtype=torch.float64), torch.randn(16, 32, dtype=torch.float64)
    bias, c = torch.randn(16, dtype=torch.float64), torch.randn(8, 16, dtype=torch.float64)
    got = torch_gemm(x, w.t(), torch.float64, bias=bias, activation="silu", c=c, alpha=0.5, beta=2.0)
    torch.testing.assert_close(got, F.silu(0.5 * (x @ w.t()) + 2.0 * c + bias))
    xb, wb = x.bfloat16(), w.bfloat16()
    wide = torch_gemm(xb, wb.t(), torch.float32, bias=bias.float(), activation="relu", alpha=2.0)
    assert wide.dtype == torch.float32
    torch.testing.assert_close(wide, F.relu(2.0 * (xb.float() @ wb.float().t()) + bias.float()))


@pytest.mark.parametrize("scaling", ["tensor", "rowcol"])
def test_torch_path_scales_fp8_as_scaled_mm_rowwise_and_per_tensor(scaling):
    a = (torch.randn(32, 64) * 4).to(torch.float8_e4m3fn)
    w = (torch.randn(48, 64) * 4).to(torch.float8_e4m3fn)
    if scaling == "tensor":
        scale_a, scale_b = torch.tensor(0.25), torch.tensor(0.5)
    else:
        scale_a, scale_b = torch.rand(32, 1) + 0.5, torch.rand(1, 48) + 0.5
    bias = torch.randn(48, dtype=torch.bfloat16)
    got = torch_gemm(a, w.t(), torch.bfloat16, bias=bias, activation="gelu", scale_a=scale_a, scale_b=scale_b,
                     alpha=2.0)
    want = F.gelu(2.0 * scale_a * scale_b * (a.float() @ w.float().t()) + bias.float())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=5e-2)


# ---- the operator ------------------------------------------------------------------------------
def test_the_linear_operator_is_registered_for_cpu_cuda_fake_and_autograd():
    assert str(LINEAR._schema) == ("cutlass_tune::linear(Tensor x, Tensor weight, Tensor? bias, str activation, "
                                   "str table, Tensor? residual=None, Tensor? gate=None) -> Tensor")
    for dispatch_key in ("CPU", "CUDA", "Meta", "Autograd"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key("cutlass_tune::linear", dispatch_key), dispatch_key


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", list(TORCH_ACTIVATIONS))
@pytest.mark.parametrize("shape", [(32,), (5, 32), (2, 3, 32)])
def test_opcheck_schema_fake_autograd_and_aot_dispatch(key, dtype, activation, shape):
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)
    w = torch.randn(64, 32, dtype=dtype, requires_grad=True)
    b = torch.randn(64, dtype=dtype, requires_grad=True)
    torch.library.opcheck(LINEAR, (x, w, b, activation, key))
    torch.library.opcheck(LINEAR, (x, w, None, activation, key))


def test_fake_shapes_and_refusals(key):
    with FakeTensorMode():
        x = torch.empty(2, 7, 5, 32, dtype=torch.bfloat16)
        w = torch.empty(64, 32, dtype=torch.bfloat16)
        b = torch.empty(64, dtype=torch.bfloat16)
        y = LINEAR(x, w, b, "silu", key)
        assert (y.shape, y.dtype, y.is_contiguous()) == ((2, 7, 5, 64), torch.bfloat16, True)
        assert LINEAR(x[0, 0, 0], w, None, "gelu", key).shape == (64,)
        with pytest.raises(RuntimeError, match=r"bias has shape \(32,\); it must be \(64,\)"):
            LINEAR(x, w, torch.empty(32, dtype=torch.bfloat16), "silu", key)
        with pytest.raises(RuntimeError, match="bias is torch.float32 and x is torch.bfloat16"):
            LINEAR(x, w, torch.empty(64), "silu", key)
        with pytest.raises(RuntimeError, match="activation 'swish' is not one of"):
            LINEAR(x, w, b, "swish", key)
        with pytest.raises(RuntimeError, match="do not multiply"):
            LINEAR(x, w.t(), None, "relu", key)
        with pytest.raises(RuntimeError, match="fp8 inputs need scales"):
            LINEAR(x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn), None, "none", key)


@pytest.mark.parametrize("activation", list(TORCH_ACTIVATIONS))
def test_cpu_results_and_gradients_are_torch_s(key, activation):
    # The backward recomputes the pre-activation (the fused kernel keeps none): it must give
    # torch's gradients for every activation, with and without a bias.
    for with_bias in (True, False):
        x = torch.randn(2, 6, 32, dtype=torch.float64, requires_grad=True)
        w = torch.randn(64, 32, dtype=torch.float64, requires_grad=True)
        b = torch.randn(64, dtype=torch.float64, requires_grad=True) if with_bias else None
        dy = torch.randn(2, 6, 64, dtype=torch.float64)
        got = LINEAR(x, w, b, activation, key)
        got.backward(dy)
        grads = [x.grad, w.grad] + ([b.grad] if with_bias else [])
        x.grad = w.grad = None
        if with_bias:
            b.grad = None
        want = TORCH_ACTIVATIONS[activation](F.linear(x, w, b))
        want.backward(dy)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(grads, [x.grad, w.grad] + ([b.grad] if with_bias else []))
        assert grads[1].is_contiguous()


def test_the_operator_compiles_with_no_graph_break(key):
    def block(x, w, b):
        return LINEAR(x, w, b, "gelu_tanh", key) * 2

    x, w, b = torch.randn(4, 32), torch.randn(64, 32), torch.randn(64)
    assert torch._dynamo.explain(block)(x, w, b).graph_break_count == 0
    compiled = torch.compile(block, fullgraph=True)
    torch.testing.assert_close(compiled(x, w, b), block(x, w, b))


# ---- nn.Linear(activation=...) -----------------------------------------------------------------
def test_linear_with_an_activation_keeps_nn_linear_s_state_dict(key):
    torch.manual_seed(0)
    reference = torch.nn.Linear(32, 64)
    torch.manual_seed(0)
    tuned = Linear(32, 64, table=key, activation="silu")
    assert tuned.activation is Activation.SILU
    assert list(tuned.state_dict()) == ["weight", "bias"]
    torch.testing.assert_close(tuned.state_dict(), reference.state_dict())
    reference.load_state_dict(tuned.state_dict())
    tuned.load_state_dict(torch.nn.Linear(32, 64).state_dict())
    assert "activation='silu'" in repr(tuned) and "activation" not in repr(Linear(32, 64, table=key))
    with pytest.raises(MatmulInputError, match="activation 'tanh' is not one of"):
        Linear(32, 64, table=key, activation="tanh")


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
def test_linear_forward_and_gradients_match_torch(key, activation):
    linear = torch.nn.Linear(32, 64, dtype=torch.float64)
    tuned = Linear.from_linear(linear, key, activation=activation)
    assert tuned.weight is linear.weight and tuned.activation.value == activation
    x = torch.randn(2, 3, 32, dtype=torch.float64, requires_grad=True)
    got = tuned(x)
    got.sum().backward()
    grads = x.grad, linear.weight.grad, linear.bias.grad
    x.grad = linear.weight.grad = linear.bias.grad = None
    want = TORCH_ACTIVATIONS[activation](linear(x))
    want.sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grads, (x.grad, linear.weight.grad, linear.bias.grad))
    with torch.no_grad():
        torch.testing.assert_close(tuned(x), want)


def _calls(module, *args):
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.compile(module, backend=record, fullgraph=True)(*args)
    assert len(graphs) == 1
    return [n.target for n in graphs[0].graph.nodes if n.op in ("call_function", "call_method")]


def test_without_gradients_the_forward_is_one_fused_call_and_with_them_torch_s_activation(key):
    # Inference runs the fused kernel; training keeps torch's saved pre-activation (no
    # recomputed GEMM in the backward).
    tuned = Linear(32, 64, table=key, activation="silu")
    x = torch.randn(2, 3, 32)
    with torch.no_grad():
        assert _calls(tuned, x) == [LINEAR]
    torch._dynamo.reset()
    assert _calls(tuned, x) == ["t", MM, operator.add, F.silu]
    torch._dynamo.reset()
    with torch.inference_mode():
        assert torch._dynamo.explain(tuned)(x).graph_break_count == 0


def test_linear_with_an_activation_copies_and_pickles(key):
    tuned = Linear(32, 64, table=key, activation="gelu").eval()
    x = torch.randn(4, 32)
    with torch.no_grad():
        assert torch.equal(copy.deepcopy(tuned)(x), tuned(x))
        buffer = io.BytesIO()
        torch.save(tuned, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        assert loaded.activation is Activation.GELU and torch.equal(loaded(x), tuned(x))
