"""The gated and residual fusions through the tuned path on a Hopper GPU: `matmul(gate=)` and
`torch.ops.cutlass_tune.linear(..., residual=, gate=)` against torch's fp32 math, forward and
gradients, eager and compiled. Kernels are compiled on first use (nvcc), or beforehand with
`cutlass-tune compile tests/runtime/gated_kernels.yaml` and `gated_kernels_fp8.yaml`."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import cutlass_tune
from cutlass_tune.runtime import register_table
from cutlass_tune.space import DType, Epilogue, KernelConfig, Scaling

from .test_fused_gpu import ACT, _close, _no_fallback, _table

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

BF16 = {name: KernelConfig(epilogue=Epilogue.parse(name)) for name in
        ("bias+silu+gated", "silu+gated", "gelu_tanh+gated", "residual", "bias+gelu+residual")}
FP8_GATED = KernelConfig(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128, scaling=Scaling.ROWCOL,
                         epilogue=Epilogue.parse("silu+gated"))
LINEAR = torch.ops.cutlass_tune.linear.default


def _calls(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, caught


@pytest.mark.parametrize("name", ["bias+silu+gated", "gelu_tanh+gated"])
def test_gated_kernels_run_through_matmul_and_match_fp32_math(name):
    table = _table(BF16.values())
    epilogue = Epilogue.parse(name)
    x = torch.randn(2048, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(3072, 4096, dtype=torch.bfloat16, device="cuda") / 64  # a nearby N: the nearest row's kernel
    bias = torch.randn(3072, dtype=torch.bfloat16, device="cuda") if epilogue.bias else None
    gate = torch.randn(2048, 3072, dtype=torch.bfloat16, device="cuda")
    act = epilogue.activation
    got, caught = _calls(lambda: cutlass_tune.matmul(x, w.t(), table, bias=bias, activation=act, gate=gate))
    _no_fallback(caught)
    up = x.float() @ w.float().t() + (0 if bias is None else bias.float())
    want = ACT[act.value](gate.float()) * up
    _close(got, want)
    # Guards against a kernel that drops the gate or activates the product instead of C.
    assert ((got.float() - up).norm() / want.norm()).item() > 0.3
    assert ((got.float() - ACT[act.value](gate.float() * up)).norm() / want.norm()).item() > 0.3
    assert torch.equal(got, cutlass_tune.matmul(x, w.t(), table, bias=bias, activation=act, gate=gate))  # fast path
    theirs = cutlass_tune.runtime.torch_gemm(x, w.t(), torch.bfloat16, bias=bias, activation=act, gate=gate)
    _close(theirs, want)


def test_fp8_rowcol_gated_kernel_matches_scaled_math():
    table = _table([FP8_GATED])
    m, n, k = 2048, 4096, 4096
    a = (torch.randn(m, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    scale_a, scale_b = torch.rand(m, 1, device="cuda") / 50, torch.rand(1, n, device="cuda") + 0.5
    gate = torch.randn(m, n, dtype=torch.bfloat16, device="cuda")
    got, caught = _calls(lambda: cutlass_tune.matmul(a, w.t(), table, activation="silu", scale_a=scale_a,
                                                     scale_b=scale_b, gate=gate))
    _no_fallback(caught)
    _close(got, F.silu(gate.float()) * (scale_a * scale_b * (a.float() @ w.float().t())))


def test_untuned_gated_calls_fall_back_to_torch_with_the_same_math():
    table = _table([BF16["residual"]])
    x = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda")
    gate = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda")
    got, caught = _calls(lambda: cutlass_tune.matmul(x, w.t(), table, activation="silu", gate=gate))
    assert any("silu+gated" in str(c.message) and "of the gate" in str(c.message) for c in caught)
    assert torch.equal(got, F.silu(gate) * (x @ w.t()))


def _mlp(key):
    """A LLaMA MLP block: gate_proj by torch, up_proj fused with silu(gate) *, down_proj fused
    with the residual add."""
    def block(x, wg, wu, wd):
        gate = F.linear(x, wg)
        hidden = LINEAR(x, wu, None, "silu", key, gate=gate)
        return LINEAR(hidden, wd, None, "none", key, residual=x)
    return block


def _reference(x, wg, wu, wd):
    return x + F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)


def _weights(hidden=1024, inter=4096):
    def w(n, k):
        return (torch.randn(n, k, device="cuda") / k ** 0.5).bfloat16().requires_grad_()
    return w(inter, hidden), w(inter, hidden), w(hidden, inter)


def test_a_gated_mlp_runs_the_fused_kernels_eager_and_compiled():
    key = register_table(_table(BF16.values()), key="gated-gpu-mlp")
    x = torch.randn(4, 256, 1024, device="cuda", dtype=torch.bfloat16)
    weights = _weights()
    want = _reference(x.float(), *(w.float() for w in weights))
    block = _mlp(key)
    with torch.inference_mode():
        got, caught = _calls(lambda: block(x, *weights))
        _no_fallback(caught)
        assert got.shape == (4, 256, 1024)
        _close(got, want)
        compiled, caught = _calls(lambda: torch.compile(block, fullgraph=True)(x, *weights))
        _no_fallback(caught)
        _close(compiled, want)


def test_the_operator_s_gradients_match_torch_s_on_cuda():
    # The backward recomputes x @ w^T (+ bias) with `mm`; plain GEMMs the table lacks run in torch.
    key = register_table(_table(BF16.values()), key="gated-gpu-grad")
    x = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weights = _weights()
    dy = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _mlp(key)(x, *weights).backward(dy)
    got = [x.grad, *(w.grad for w in weights)]
    leaves = [t.detach().float().requires_grad_() for t in (x, *weights)]
    _reference(*leaves).backward(dy.float())
    for mine, ref in zip(got, (t.grad for t in leaves)):
        assert mine is not None and ((mine.float() - ref).norm() / ref.norm()).item() < 2e-2


def test_residual_inside_the_activation_gradient_on_cuda():
    key = register_table(_table(BF16.values()), key="gated-gpu-residual")
    x = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(4096, 1024, device="cuda") / 32).bfloat16().requires_grad_()
    b = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    r = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with torch.no_grad():
        got, caught = _calls(lambda: LINEAR(x, w, b, "gelu", key, residual=r))
    _no_fallback(caught)
    _close(got, F.gelu(F.linear(x.float(), w.float(), b.float()) + r.float()))
    dy = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        LINEAR(x, w, b, "gelu", key, residual=r).backward(dy)
    leaves = [t.detach().float().requires_grad_() for t in (x, w, b, r)]
    F.gelu(F.linear(*leaves[:3]) + leaves[3]).backward(dy.float())
    for mine, ref in zip((x.grad, w.grad, b.grad, r.grad), (t.grad for t in leaves)):
        assert ((mine.float() - ref).norm() / ref.norm()).item() < 2e-2
