"""The gated and residual fusions on the CPU: matmul's operands, torch's path for the same math, and
`torch.ops.cutlass_tune.linear(..., residual=, gate=)`: schema, fake kernel, results, gradients
(the backward's recomputation) and torch.compile without a graph break."""

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import cutlass_tune
from cutlass_tune.runtime import MatmulInputError, operation_of, register_table, torch_gemm
from cutlass_tune.space import Activation, Epilogue, Scaling

from .tables import csv_table

LINEAR = torch.ops.cutlass_tune.linear.default
ACT = {"none": lambda t: t, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
       "silu": F.silu}


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    table = csv_table(tmp_path_factory.mktemp("gated") / "best.csv", [("bf16", "tn", 128, 64, 32)])
    return register_table(table, key="test-gated")


def _formula(x, w, b, activation, residual=None, gate=None):
    """The operator's math in torch, whose autograd gives the reference gradients."""
    up = F.linear(x, w, b)
    if gate is not None:
        return ACT[activation](gate) * up
    return ACT[activation](up if residual is None else up + residual)


# ---- matmul's operands and the torch path --------------------------------------------------------
def test_a_gate_poses_the_gated_epilogue():
    a, b = torch.randn(8, 32, dtype=torch.bfloat16), torch.randn(16, 32, dtype=torch.bfloat16).t()
    gate, bias = torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(16, dtype=torch.bfloat16)
    epilogue, scaling = operation_of(a, b, torch.bfloat16, bias=bias, activation="silu", gate=gate)
    assert (epilogue, scaling) == (Epilogue(bias=True, activation=Activation.SILU, gated=True), Scaling.NONE)
    assert epilogue.name == "bias+silu+gated"


@pytest.mark.parametrize(("operands", "message"), [
    ({"gate": torch.randn(16, 8, dtype=torch.bfloat16)}, r"gate has shape \(16, 8\); it must be \(8, 16\) \(the "
                                                         "gate's pre-activation"),
    ({"gate": torch.randn(8, 16)}, "gate has dtype torch.float32; it must be torch.bfloat16"),
    ({"gate": torch.randn(16, 8, dtype=torch.bfloat16).t()}, "gate with strides \\(1, 8\\) is not contiguous"),
    ({"gate": torch.randn(8, 16, dtype=torch.bfloat16), "c": torch.randn(8, 16, dtype=torch.bfloat16)},
     "c and gate are both read as the kernel's C: pass one"),
    ({"gate": 1.0}, "gate must be a torch.Tensor or None, not float"),
])
def test_bad_gates_are_one_line_errors(operands, message):
    a, b = torch.randn(8, 32, dtype=torch.bfloat16), torch.randn(16, 32, dtype=torch.bfloat16).t()
    with pytest.raises(MatmulInputError, match=message) as err:
        operation_of(a, b, torch.bfloat16, **operands)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("activation", list(ACT))
@pytest.mark.parametrize("with_bias", [True, False])
def test_torch_path_is_the_activated_gate_times_f_linear(activation, with_bias):
    x, w = torch.randn(8, 32, dtype=torch.bfloat16), torch.randn(16, 32, dtype=torch.bfloat16)
    bias = torch.randn(16, dtype=torch.bfloat16) if with_bias else None
    gate = torch.randn(8, 16, dtype=torch.bfloat16)
    got = torch_gemm(x, w.t(), torch.bfloat16, bias=bias, activation=activation, gate=gate)
    assert torch.equal(got, ACT[activation](gate) * F.linear(x, w, bias))


def test_torch_path_gates_scaled_fp8_and_alpha():
    a = (torch.randn(32, 64) * 4).to(torch.float8_e4m3fn)
    w = (torch.randn(48, 64) * 4).to(torch.float8_e4m3fn)
    scale_a, scale_b = torch.rand(32, 1) + 0.5, torch.rand(1, 48) + 0.5
    bias, gate = torch.randn(48, dtype=torch.bfloat16), torch.randn(32, 48, dtype=torch.bfloat16)
    got = torch_gemm(a, w.t(), torch.bfloat16, bias=bias, activation="silu", scale_a=scale_a, scale_b=scale_b,
                     alpha=2.0, gate=gate)
    want = F.silu(gate.float()) * (2.0 * scale_a * scale_b * (a.float() @ w.float().t()) + bias.float())
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=5e-2)


# ---- the operator ------------------------------------------------------------------------------
def test_the_schema_takes_residual_and_gate_last():
    # The Inductor pass and patch call linear(x, w, b, activation, table, residual=..., gate=...).
    assert str(LINEAR._schema) == ("cutlass_tune::linear(Tensor x, Tensor weight, Tensor? bias, str activation, "
                                   "str table, Tensor? residual=None, Tensor? gate=None) -> Tensor")
    # the operator itself where the native library defines it (built in this host's cache), else custom_op's
    assert getattr(cutlass_tune.runtime.linear, "_opoverload", cutlass_tune.runtime.linear) is LINEAR


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", ["none", "silu", "gelu"])
@pytest.mark.parametrize("which", ["residual", "gate"])
def test_opcheck_schema_fake_autograd_and_aot_dispatch(key, dtype, activation, which):
    x = torch.randn(2, 5, 32, dtype=dtype, requires_grad=True)
    w = torch.randn(64, 32, dtype=dtype, requires_grad=True)
    b = torch.randn(64, dtype=dtype, requires_grad=True)
    other = torch.randn(2, 5, 64, dtype=dtype, requires_grad=True)
    torch.library.opcheck(LINEAR, (x, w, b, activation, key), {which: other})
    torch.library.opcheck(LINEAR, (x, w, None, activation, key), {which: other})


def test_fake_shapes_and_refusals(key):
    with FakeTensorMode():
        x = torch.empty(2, 7, 32, dtype=torch.bfloat16)
        w = torch.empty(64, 32, dtype=torch.bfloat16)
        other = torch.empty(2, 7, 64, dtype=torch.bfloat16)
        for kwargs in ({"gate": other}, {"residual": other}):
            y = LINEAR(x, w, None, "silu", key, **kwargs)
            assert (y.shape, y.dtype, y.is_contiguous()) == ((2, 7, 64), torch.bfloat16, True)
        with pytest.raises(RuntimeError, match="residual and gate are both the kernel's C: pass one"):
            LINEAR(x, w, None, "silu", key, residual=other, gate=other)
        with pytest.raises(RuntimeError, match=r"gate has shape \(14, 64\); it must be the output's, \(2, 7, 64\)"):
            LINEAR(x, w, None, "silu", key, gate=other.reshape(14, 64))
        with pytest.raises(RuntimeError, match="residual is torch.float32 and x is torch.bfloat16"):
            LINEAR(x, w, None, "none", key, residual=torch.empty(2, 7, 64))


@pytest.mark.parametrize("activation", list(ACT))
@pytest.mark.parametrize("which", ["residual", "gate"])
def test_cpu_results_and_gradients_are_those_of_torch_s_formula(key, activation, which):
    # The backward recomputes x @ w^T + bias (the fused kernel keeps none): the residual is inside
    # the activation, and the gate's gradient needs the product.
    for with_bias in (True, False):
        x = torch.randn(2, 6, 32, dtype=torch.float64, requires_grad=True)
        w = torch.randn(64, 32, dtype=torch.float64, requires_grad=True)
        b = torch.randn(64, dtype=torch.float64, requires_grad=True) if with_bias else None
        other = torch.randn(2, 6, 64, dtype=torch.float64, requires_grad=True)
        dy = torch.randn(2, 6, 64, dtype=torch.float64)
        leaves = [x, w, other] + ([b] if with_bias else [])
        got = LINEAR(x, w, b, activation, key, **{which: other})
        got_grads = torch.autograd.grad(got, leaves, dy)
        want = _formula(x, w, b, activation, **{which: other})
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_grads, torch.autograd.grad(want, leaves, dy))


@pytest.mark.parametrize(("activation", "which"), [("silu", "gate"), ("gelu_tanh", "gate"), ("none", "gate"),
                                                   ("gelu", "residual"), ("none", "residual")])
def test_gradcheck_in_float64(key, activation, which):
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    other = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: LINEAR(t[0], t[1], t[2], activation, key, **{which: t[3]}),
                                    (x, w, b, other))


def test_only_the_gate_s_gradient_recomputes_the_product(key):
    # d(up) = grad * activation(gate) needs no GEMM of the forward's; d(gate) needs x @ w^T.
    x = torch.randn(4, 32, requires_grad=True)
    w = torch.randn(64, 32, requires_grad=True)
    gate = torch.randn(4, 64)
    calls = []
    mm = torch.ops.cutlass_tune.mm

    class Count(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket is mm:
                calls.append(func)
            return func(*args, **(kwargs or {}))

    y = LINEAR(x, w, None, "silu", key, gate=gate)
    with Count():
        y.sum().backward()
    assert len(calls) == 2  # dX and dW only
    calls.clear()
    y = LINEAR(x, w, None, "silu", key, gate=gate.requires_grad_())
    with Count():
        y.sum().backward()
    assert len(calls) == 3 and gate.grad is not None


def test_a_gated_mlp_compiles_with_no_graph_break(key):
    torch.manual_seed(0)
    wg, wu, wd = torch.randn(64, 32), torch.randn(64, 32), torch.randn(32, 64)

    def mlp(x):
        gate = F.linear(x, wg)
        hidden = LINEAR(x, wu, None, "silu", key, gate=gate)
        return LINEAR(hidden, wd, None, "none", key, residual=x)

    x = torch.randn(2, 4, 32)
    assert torch._dynamo.explain(mlp)(x).graph_break_count == 0
    compiled = torch.compile(mlp, fullgraph=True)
    torch.testing.assert_close(compiled(x), x + F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd))
    xg = x.clone().requires_grad_()
    compiled(xg).square().sum().backward()
    xe = x.clone().requires_grad_()
    mlp(xe).square().sum().backward()
    # Inductor's fused fp32 kernels round in another order: gradients of size ~1e3 differ in the last bits
    torch.testing.assert_close(xg.grad, xe.grad, rtol=1e-5, atol=1e-2)


def test_the_space_files_precompile_exactly_the_gpu_tests_kernels():
    # Guards against the lead's precompile step building other kernels than the GPU tests run.
    from pathlib import Path

    from cutlass_tune.space._spec import load_space

    from .test_gated_gpu import BF16, FP8_GATED

    here = Path(__file__).parent
    assert {c.hash for c in load_space(here / "gated_kernels.yaml").valid} == {c.hash for c in BF16.values()}
    assert [c.hash for c in load_space(here / "gated_kernels_fp8.yaml").valid] == [FP8_GATED.hash]
