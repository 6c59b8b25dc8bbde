"""The MoE layer's GLU stage on a Hopper GPU: at a Qwen3-like shape (hidden 2048, intermediate
768, top 8) the layer with a GLU row in its table runs the grouped GLU kernel for gate_up and
its activation, and gives the unfused path's output within bf16 tolerance; eager, under
torch.compile (no graph break; CUDA graph trees too) and in a CUDA graph replayed with new routing.

Run on the GPU host (nvcc builds three kernels into the user's kernel cache first, 2-3 minutes):
    python3 -m pytest tests/runtime/test_moe_glu_gpu.py -m gpu -s -p no:cacheprovider"""

import json
import warnings

import pandas as pd
import pytest
import torch

from cutlass_tune.runtime import BestTable, register_table
from cutlass_tune.runtime import _moe_glu as glu
from cutlass_tune.runtime._moe import MoEExperts, moe_experts
from cutlass_tune.space import Layout, Problem
from cutlass_tune.tables import experts_cells

from ..compile.test_nvcc_grouped_glu import GROUPED_GLU
from .test_grouped_gpu import kernel, no_fallback

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

E, H, INTER, TOP_K, TOKENS = 16, 2048, 768, 8, 1024
ROWS = TOKENS * TOP_K


def _row(cfg, n, k):
    p = Problem.experts(E, n, k, ROWS, **cfg.operation.operation_fields())
    return dict(gpu="any", problem=p.name, m=ROWS, n=n, k=k, kernel=cfg.name, config_hash=cfg.hash,
                config=json.dumps(cfg.to_dict(), sort_keys=True), raster="along_n", swizzle=1, splits=1,
                decomposition="heuristic", ratio=1.5, **p.operation.cells(), **experts_cells(p))


def glu_table() -> BestTable:
    """The layer's plain gate_up and down kernels (tn) and the GLU gate_up kernel (silu+glu, the
    Qwen3-235B table's tile, 128x192 cluster 1x2)."""
    plain = kernel(Layout.COL)
    return BestTable(pd.DataFrame([_row(plain, 2 * INTER, H), _row(plain, H, INTER),
                                   _row(GROUPED_GLU[0], 2 * INTER, H)]))


def operands(seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(TOKENS, H, device="cuda", dtype=torch.bfloat16, generator=g)
    weights, index = torch.randn(TOKENS, E, device="cuda", generator=g).softmax(-1).topk(TOP_K, dim=-1)
    gate_up = torch.randn(E, 2 * INTER, H, device="cuda", dtype=torch.bfloat16, generator=g) / 32
    down = torch.randn(E, H, INTER, device="cuda", dtype=torch.bfloat16, generator=g) / 32
    return x, index, weights, gate_up, down


def close(got, want, tol=2e-2):
    assert got.shape == want.shape and torch.isfinite(got).all()
    error = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert error < tol, error


@pytest.fixture(scope="module")
def key():
    return register_table(glu_table(), key="moe-glu-gpu")


def _unfused(x, index, weights, gate_up, down, key):
    with torch.no_grad():
        return moe_experts(x, index, weights, gate_up, down, table=key, glu=False)


def test_the_glu_kernel_runs_the_layers_gate_up_and_matches_the_unfused_path(key, monkeypatch):
    x, index, weights, gate_up, down = operands()
    ran = []
    stage = glu.gate_up_glu
    monkeypatch.setattr(glu, "gate_up_glu", lambda *a: ran.append(a[0].shape) or stage(*a))
    assert MoEExperts(gate_up, down, table=key, glu=True).glu_path == "glu"
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        got = moe_experts(x, index, weights, gate_up, down, table=key, glu=True)
        again = moe_experts(x, index, weights, gate_up, down, table=key, glu=True)
    no_fallback(caught)
    assert ran == [(ROWS, H)] * 2 and torch.equal(got, again)
    close(got, _unfused(x, index, weights, gate_up, down, key))


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_the_glu_layer_under_torch_compile_takes_no_graph_break(key, mode):
    """The module, as a model holds it: CUDA graph trees keep its parameters in place (a plain
    tensor argument they copy into a buffer of their own at every replay), so the weights laid
    out in their warm-up are the ones their graph reads."""
    torch._dynamo.reset()
    x, index, weights, gate_up, down = operands()
    want = _unfused(x, index, weights, gate_up, down, key)
    module = MoEExperts(gate_up, down, table=key, glu=True)
    compiled = torch.compile(module, fullgraph=True, mode=mode)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(3):
            got = compiled(x, index, weights).clone()
    no_fallback(caught)  # the GLU weights laid out before the graph was recorded: no unfused capture
    close(got, want)


def test_the_glu_layer_in_a_cuda_graph_replays_new_routing(key):
    x, index, weights, gate_up, down = operands()
    with torch.no_grad():
        moe_experts(x, index, weights, gate_up, down, table=key, glu=True)  # lays the GLU weights out before capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.cuda.graph(graph):
                out = moe_experts(x, index, weights, gate_up, down, table=key, glu=True)
        no_fallback(caught)
        x2, index2, weights2, _, _ = operands(seed=1)
        x.copy_(x2)
        index.copy_(index2)
        weights.copy_(weights2)
        graph.replay()
        torch.cuda.synchronize()
    close(out, _unfused(x, index, weights, gate_up, down, key))


def test_a_weight_updated_in_place_is_laid_out_again(key):
    x, index, weights, gate_up, down = operands()
    with torch.no_grad():
        moe_experts(x, index, weights, gate_up, down, table=key, glu=True)
        gate_up.mul_(-1)
        got = moe_experts(x, index, weights, gate_up, down, table=key, glu=True)
    close(got, _unfused(x, index, weights, gate_up, down, key))
