"""Fused epilogues and fp8 scales through the tuned path on a Hopper GPU: `matmul`, the operator
and `nn.Linear(activation=...)` against torch's fp32 math, kernels compiled on first use (nvcc)."""

import json
import warnings

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import cutlass_tune
from cutlass_tune.nn import Linear
from cutlass_tune.runtime import BestTable, register_table
from cutlass_tune.space import DType, Epilogue, KernelConfig, Scaling

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

ACT = {"none": lambda t: t, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
       "silu": F.silu}
BF16 = {name: KernelConfig(epilogue=Epilogue.parse(name)) for name in
        ("bias", "bias+relu", "bias+gelu", "bias+gelu_tanh", "bias+silu", "silu", "residual", "bias+silu+residual")}
FP8 = {(e, s): KernelConfig(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128, cluster_m=2, fp8_fast_accum=True,
                            epilogue=Epilogue.parse(e), scaling=Scaling(s))
       for e in ("none", "bias", "bias+silu") for s in ("tensor", "rowcol")}


def _table(configs, m=2048, n=4096, k=4096):
    rows = [dict(gpu="any", problem=f"{m}x{n}x{k}_{c.dtype_a.value}_{c.epilogue.name}_{c.scaling.value}", m=m, n=n,
                 k=k, dtype_a=c.dtype_a.value, dtype_b=c.dtype_b.value, dtype_d="bf16", layout="tn", kernel=c.name,
                 config_hash=c.hash, config=json.dumps(c.to_dict(), sort_keys=True), raster="along_n", swizzle=4,
                 splits=1, decomposition="heuristic", epilogue=c.epilogue.name, scaling=c.scaling.value,
                 ratio=1.0)  # torch's speed: matmul's min_ratio 1.0 runs the kernel
            for c in configs]
    return BestTable(pd.DataFrame(rows))


def _close(got, want, tol=2e-2):
    assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
    assert ((got.float() - want).norm() / want.norm()).item() < tol


def _no_fallback(caught):
    assert not [w for w in caught if "cutlass_tune" in str(w.message)], [str(w.message) for w in caught]


@pytest.mark.parametrize("name", list(BF16))
def test_bf16_epilogues_run_their_kernel_and_match_fp32_math(name):
    table = _table(BF16.values())
    epilogue = Epilogue.parse(name)
    x = torch.randn(2048, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(3072, 4096, dtype=torch.bfloat16, device="cuda") / 64  # a nearby N: the nearest row's kernel
    bias = torch.randn(3072, dtype=torch.bfloat16, device="cuda") if epilogue.bias else None
    c = torch.randn(2048, 3072, dtype=torch.bfloat16, device="cuda") if epilogue.residual else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = cutlass_tune.matmul(x, w.t(), table, bias=bias, activation=epilogue.activation, c=c)
        again = cutlass_tune.matmul(x, w.t(), table, bias=bias, activation=epilogue.activation, c=c)  # fast path
    _no_fallback(caught)
    z = x.float() @ w.float().t() + (0 if c is None else c.float()) + (0 if bias is None else bias.float())
    _close(got, ACT[epilogue.activation.value](z))
    assert torch.equal(got, again)


def test_alpha_and_beta_reach_the_kernel():
    table = _table(BF16.values())
    x = torch.randn(2048, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda") / 64
    c = torch.randn(2048, 4096, dtype=torch.bfloat16, device="cuda")
    got = cutlass_tune.matmul(x, w.t(), table, c=c, alpha=0.5, beta=-2.0)
    _close(got, 0.5 * (x.float() @ w.float().t()) - 2.0 * c.float())
    new_alpha = cutlass_tune.matmul(x, w.t(), table, c=c, alpha=2.0, beta=1.0)  # same buffers, new scalars
    _close(new_alpha, 2.0 * (x.float() @ w.float().t()) + c.float())


@pytest.mark.parametrize(("epilogue", "scaling"), list(FP8))
def test_fp8_scaled_kernels_match_scaled_mm_math(epilogue, scaling):
    table = _table(FP8.values())
    m, n, k = 2048, 4096, 4096
    a = (torch.randn(m, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    if scaling == "tensor":
        scale_a, scale_b = torch.tensor(0.02, device="cuda"), torch.tensor(0.5, device="cuda")
    else:
        scale_a, scale_b = torch.rand(m, 1, device="cuda") / 50, torch.rand(1, n, device="cuda") + 0.5
    e = Epilogue.parse(epilogue)
    bias = torch.randn(n, dtype=torch.bfloat16, device="cuda") if e.bias else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = cutlass_tune.matmul(a, w.t(), table, bias=bias, activation=e.activation, scale_a=scale_a,
                                  scale_b=scale_b)
    _no_fallback(caught)
    want = ACT[e.activation.value](scale_a * scale_b * (a.float() @ w.float().t())
                                   + (0 if bias is None else bias.float()))
    _close(got, want)
    theirs = cutlass_tune.runtime.torch_gemm(a, w.t(), torch.bfloat16, bias=bias, activation=e.activation,
                                             scale_a=scale_a, scale_b=scale_b)
    _close(theirs, want)


def test_untuned_epilogues_fall_back_to_torch_with_the_same_math():
    table = _table([BF16["bias+silu"]])
    x = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda")
    bias = torch.randn(1024, dtype=torch.bfloat16, device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = cutlass_tune.matmul(x, w.t(), table, bias=bias, activation="gelu")
    assert any("no tuned problem for bf16 -> bf16 tn bias+gelu" in str(w.message) and "F.linear and torch's gelu"
               in str(w.message) for w in caught)
    assert torch.equal(got, F.gelu(F.linear(x, w, bias)))
    plain = cutlass_tune.matmul(x, w.t(), table)  # a plain call never runs the bias+silu kernel
    assert torch.equal(plain, x @ w.t())


@pytest.mark.parametrize("activation", ["gelu_tanh", "silu"])
def test_linear_runs_the_fused_kernel_in_inference_eager_and_compiled(activation):
    key = register_table(_table(BF16.values(), m=1024, n=4096, k=1024), key=f"fused-gpu-{activation}")
    linear = torch.nn.Linear(1024, 4096, device="cuda", dtype=torch.bfloat16)
    tuned = Linear.from_linear(linear, key, activation=activation).eval()
    x = torch.randn(4, 256, 1024, device="cuda", dtype=torch.bfloat16)
    want = ACT[activation](x.float() @ linear.weight.float().t() + linear.bias.float())
    with torch.inference_mode(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for module in (tuned, torch.compile(tuned, fullgraph=True)):
            got = module(x)
            assert got.shape == (4, 256, 4096)
            _close(got, want)
    _no_fallback(caught)
    y = tuned(x.requires_grad_())  # training: mm, the bias add and torch's activation
    y.float().square().mean().backward()
    assert x.grad is not None and linear.weight.grad is not None and torch.isfinite(linear.weight.grad).all()


def test_the_operator_s_backward_recomputes_the_pre_activation_on_cuda():
    key = register_table(_table(BF16.values(), m=1024, n=1024, k=1024), key="fused-gpu-backward")
    x = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16) / 32).requires_grad_()
    b = torch.randn(1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    torch.ops.cutlass_tune.linear(x, w, b, "silu", key).backward(dy)
    got = x.grad, w.grad, b.grad
    xf, wf, bf = (t.detach().float().requires_grad_() for t in (x, w, b))
    F.silu(F.linear(xf, wf, bf)).backward(dy.float())
    for mine, ref in zip(got, (xf.grad, wf.grad, bf.grad)):
        assert ((mine.float() - ref).norm() / ref.norm()).item() < 2e-2
