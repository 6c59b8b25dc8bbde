"""patch(fuse=True) and the inductor_options pass on a Hopper GPU: LLaMA- and BERT-like blocks whose
Linear + GELU, gated product and residual adds run the tuned fused kernels (the operator's calls
counted, no fallback warning), outputs equal torch's math within bf16 tolerance. Kernels (as
test_fused_gpu's and test_gated_gpu's: cooperative 128x128) are compiled on first use."""

import copy
import json
import warnings

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlass_tune
from cutlass_tune.runtime import BestTable, _dispatch
from cutlass_tune.space import Epilogue, KernelConfig

from .test_fused_gpu import _close, _no_fallback

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]
BF16 = torch.bfloat16
D, FFN, TOKENS = 1024, 4096, 2048


def _table(entries):
    """A table of one row per (epilogue, N, K) at M = TOKENS, each the default config of its epilogue."""
    rows = []
    for name, n, k in entries:
        c = KernelConfig(epilogue=Epilogue.parse(name))
        rows.append(dict(gpu="any", problem=f"{TOKENS}x{n}x{k}_bf16_{name}", m=TOKENS, n=n, k=k, dtype_a="bf16",
                         dtype_b="bf16", dtype_d="bf16", layout="tn", kernel=c.name, config_hash=c.hash,
                         config=json.dumps(c.to_dict(), sort_keys=True), raster="along_n", swizzle=4, splits=1,
                         decomposition="heuristic", epilogue=name, scaling="none"))
    return BestTable(pd.DataFrame(rows))


class LlamaMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(D, FFN, bias=False), nn.Linear(D, FFN, bias=False)
        self.down_proj = nn.Linear(FFN, D, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    """o_proj and the MLP added to the residual stream, attention's scores left out."""

    def __init__(self):
        super().__init__()
        self.norm, self.o_proj, self.mlp = nn.RMSNorm(D), nn.Linear(D, D, bias=False), LlamaMLP()

    def forward(self, x):
        x = x + self.o_proj(self.norm(x))
        return x + self.mlp(self.norm(x))


class GELUActivation(nn.Module):  # transformers' name, as patch reads the structure
    def forward(self, x):
        return F.gelu(x)


class BertIntermediate(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense, self.intermediate_act_fn = nn.Linear(D, FFN), GELUActivation()

    def forward(self, x):
        return self.intermediate_act_fn(self.dense(x))


class BertBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.intermediate, self.output, self.norm = BertIntermediate(), nn.Linear(FFN, D), nn.LayerNorm(D)

    def forward(self, x):
        return self.norm(self.output(self.intermediate(x)) + x)


TABLE = [("silu+gated", FFN, D), ("residual", D, D), ("residual", D, FFN), ("bias+gelu", FFN, D),
         ("bias+residual", D, FFN)]


@pytest.fixture
def calls(monkeypatch):
    """The fused epilogues the operator resolved to a plan (not the plain GEMMs), once per call
    signature: the dispatcher's `resolve` is where both the Python door and the native operator
    (which launches from C++ after that) decide what a call runs."""
    seen = []
    run = _dispatch.resolve

    def counted(table, call):
        plan = run(table, call)
        if not call.problem.epilogue.is_plain:
            seen.append(call.problem.epilogue.name)
        return plan

    monkeypatch.setattr(_dispatch, "resolve", counted)
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):  # a cached graph would skip the pass's decisions
        yield seen


def _models(cls):
    """The block in bf16 on the GPU, its input, and its output by the same weights in fp32."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        reference = cls().eval()
    tuned = copy.deepcopy(reference).to(BF16)
    x = torch.randn(2, TOKENS // 2, D, device="cuda", dtype=BF16)
    with torch.no_grad():
        want = reference(x.float())
    return tuned, x, want


def _run(fn):
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
        torch.cuda.synchronize()
    _no_fallback(caught)
    return out


@pytest.mark.parametrize("cls, fused", [(LlamaBlock, ["silu+gated"]), (BertBlock, ["bias+gelu"])])
def test_patch_fuses_the_blocks_and_matches_torch(cls, fused, calls):
    tuned, x, want = _models(cls)
    report = cutlass_tune.patch(tuned, _table(TABLE), min_ratio=0, min_kernel_us=0)
    assert [d.fused for d in report.fused] == fused, str(report)
    out = _run(lambda: tuned(x))
    assert calls == fused  # the eager patch fuses activations and gates, not residual adds
    _close(out, want)


@pytest.mark.parametrize("cls, fused", [(LlamaBlock, {"silu+gated", "residual"}),
                                        (BertBlock, {"bias+gelu", "bias+residual"})])
def test_the_pass_fuses_the_blocks_and_matches_torch(cls, fused, calls):
    tuned, x, want = _models(cls)
    options = cutlass_tune.inductor_options(_table(TABLE), min_ratio=0, min_kernel_us=0)
    compiled = torch.compile(tuned, options=options)
    out = _run(lambda: compiled(x))
    made = options["post_grad_custom_post_pass"].decisions
    assert {d.epilogue for d in made if d.fused} == fused, [str(d) for d in made]
    assert set(calls) == fused
    _close(out, want)
