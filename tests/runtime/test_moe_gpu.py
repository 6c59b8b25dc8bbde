"""The MoE experts layer on a Hopper GPU: the tuned grouped GEMMs inside `cutlass_tune.moe_experts`
against transformers' forward, no host sync, CUDA graph capture, torch.compile, the fallback for
untuned shapes, and the native gather and combine (cutlass_tune/native/moe.cu) against the
torch ops they replace.

Run: pytest tests/runtime/test_moe_gpu.py -s"""

import warnings

import pytest
import torch

import cutlass_tune
from cutlass_tune.runtime import _moe_routing, register_table
from cutlass_tune.runtime._moe import moe_combine, moe_experts, moe_gather, moe_routing
from cutlass_tune.space import Layout

from .test_grouped_gpu import grouped_table, no_fallback

pytestmark = pytest.mark.gpu

E, H, INTER, TOP_K, TOKENS = 8, 1024, 512, 2, 2048
ROWS = TOKENS * TOP_K


def experts_table():
    """Tuned kernels of the layer's two GEMMs (tn) and of both dA problems of its backward (tt)."""
    return grouped_table([(E, 2 * INTER, H, ROWS, Layout.COL), (E, H, INTER, ROWS, Layout.COL),
                          (E, H, 2 * INTER, ROWS, Layout.ROW), (E, INTER, H, ROWS, Layout.ROW)])


def operands(tokens=TOKENS, grad=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(grad)
    scores = torch.randn(tokens, E, device="cuda", generator=g)
    weights, index = scores.softmax(-1).topk(TOP_K, dim=-1)
    gate_up = (torch.randn(E, 2 * INTER, H, device="cuda", dtype=torch.bfloat16, generator=g) / 32)
    down = (torch.randn(E, H, INTER, device="cuda", dtype=torch.bfloat16, generator=g) / 32)
    return x, index, weights.requires_grad_(grad), gate_up.requires_grad_(grad), down.requires_grad_(grad)


def torch_layer(x, index, weights, gate_up, down):
    """transformers' "grouped_mm" experts forward on the same weights."""
    from types import SimpleNamespace

    transformers = pytest.importorskip("transformers", minversion="5")
    experts = SimpleNamespace(num_experts=E, has_gate=True, has_bias=False, is_transposed=False,
                              has_post_expert_norm=False, _is_expert_parallel=False, gate_up_proj=gate_up,
                              down_proj=down, act_fn=torch.nn.functional.silu)
    experts._apply_gate = lambda h: transformers.integrations.moe._default_apply_gate(experts, h)
    return transformers.integrations.moe.grouped_mm_experts_forward(experts, x, index, weights)


def close(got, want, tol=2e-2, name=""):
    assert got.shape == want.shape and torch.isfinite(got).all(), name
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < tol, name


@pytest.mark.nvcc
def test_layer_with_a_table_matches_transformers_forward():
    key = register_table(experts_table(), key="moe-gpu")
    x, index, weights, gate_up, down = operands()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = moe_experts(x, index, weights, gate_up, down, table=key)
    no_fallback(caught)
    close(got, torch_layer(x, index, weights, gate_up, down))


@pytest.mark.nvcc
def test_layer_gradients_with_a_table_match_torch():
    key = register_table(experts_table(), key="moe-gpu")
    tensors = operands(grad=True)
    grad = torch.randn(TOKENS, H, device="cuda", dtype=torch.bfloat16)
    moe_experts(*tensors, table=key).backward(grad)
    got = [t.grad.clone() for t in (tensors[0], tensors[2], tensors[3], tensors[4])]
    for t in tensors:
        t.grad = None
    torch_layer(*tensors).backward(grad)
    for name, g, t in zip(("hidden", "routing weights", "gate_up", "down"), got,
                          (tensors[0], tensors[2], tensors[3], tensors[4]), strict=True):
        close(g, t.grad, name=name)


def test_untuned_shapes_fall_back_to_torch_and_still_match():
    key = register_table(grouped_table([(16, 256, 256, 64, Layout.COL)]), key="moe-gpu-untuned")
    x, index, weights, gate_up, down = operands(tokens=256)
    with pytest.warns(RuntimeWarning, match="no tuned grouped problem"):
        got = moe_experts(x, index, weights, gate_up, down, table=key)
    close(got, torch_layer(x, index, weights, gate_up, down))


@pytest.mark.nvcc
def test_no_host_sync():
    key = register_table(experts_table(), key="moe-gpu")
    x, index, weights, gate_up, down = operands()
    trained = gate_up.detach().clone().requires_grad_()

    def run():
        routing = moe_routing(index, E)
        moe_combine(moe_gather(x, routing), routing, weights)
        moe_experts(x, index, weights, gate_up, down, table=key)  # eager inference: the kernels called directly
        # the operator's path, forward and backward
        moe_experts(x, index, weights, trained, down, table=key).float().sum().backward()

    run()  # loads and prepares every kernel outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.nvcc
def test_cuda_graph_replays_new_routing():
    key = register_table(experts_table(), key="moe-gpu")
    x, index, weights, gate_up, down = operands()
    with torch.no_grad():
        moe_experts(x, index, weights, gate_up, down, table=key)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = moe_experts(x, index, weights, gate_up, down, table=key)
        x2, index2, weights2, _, _ = operands(seed=1)
        x.copy_(x2)
        index.copy_(index2)
        weights.copy_(weights2)
        graph.replay()
        close(out, torch_layer(x, index, weights, gate_up, down))


@pytest.mark.nvcc
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_layer_under_torch_compile(mode):
    torch._dynamo.reset()
    key = register_table(experts_table(), key="moe-gpu")
    x, index, weights, gate_up, down = operands()
    compiled = torch.compile(lambda *t: moe_experts(*t, table=key), fullgraph=True, mode=mode)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            for _ in range(3):
                got = compiled(x, index, weights, gate_up, down)
    no_fallback(caught)
    close(got, torch_layer(x, index, weights, gate_up, down))


def test_layer_is_deterministic():
    x, index, weights, gate_up, down = operands(grad=True)
    runs = []
    for _ in range(2):
        out = moe_experts(x, index, weights, gate_up, down, table=None)
        runs.append((out, *torch.autograd.grad(out.float().square().sum(), (x, weights))))
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------
# The native gather and combine

native = pytest.mark.skipif(not _moe_routing._load_native(), reason="the native extension is not built")


@native
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("hidden", [1024, 36])  # 16-byte vectors, and rows that take one element at a time
@pytest.mark.parametrize("top_k", [1, 2, 8])
def test_native_ops_match_the_torch_ops(dtype, hidden, top_k):
    tokens = 300
    index = torch.rand(tokens, 16, device="cuda").topk(top_k, dim=-1).indices
    r = moe_routing(index, 16)
    x = torch.randn(tokens, hidden, device="cuda", dtype=dtype)
    y = torch.randn(tokens * top_k, hidden, device="cuda", dtype=dtype)
    w = torch.rand(tokens, top_k, device="cuda")
    ops = torch.ops.cutlass_tune
    rows = _moe_routing
    assert torch.equal(ops.moe_gather(x, r.inv, None, top_k), rows._torch_gather(x, r.perm, r.inv, None, top_k))
    torch.testing.assert_close(ops.moe_gather(x, r.inv, w, top_k), rows._torch_gather(x, r.perm, r.inv, w, top_k))
    for weights in (None, w):
        torch.testing.assert_close(ops.moe_combine(y, r.inv, weights, top_k),
                                   rows._torch_combine(y, r.perm, r.inv, weights, top_k))
    torch.testing.assert_close(ops.moe_weights_grad(x, y, r.inv, top_k),
                               rows._torch_weights_grad(x, y, r.inv, top_k), rtol=1e-4, atol=1e-3)
    again = ops.moe_combine(y, r.inv, w, top_k)
    assert torch.equal(again, ops.moe_combine(y, r.inv, w, top_k))  # same bits


@native
@pytest.mark.parametrize("experts,tokens,top_k", [(8, 300, 2), (64, 512, 6), (128, 4096, 8), (384, 1, 8),
                                                  (160, 5000, 6), (16, 0, 2)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_native_routing_is_torch_s_stable_sort(experts, tokens, top_k, dtype):
    """`moe_route` (the counting sort in three launches) gives what torch's stable sort,
    searchsorted and scatter give, bit for bit; another rank's ids (E or more) sort last, the
    offsets the same."""
    assert "moe_route" in _moe_routing._native
    g = torch.Generator(device="cuda").manual_seed(tokens)
    index = torch.rand(tokens, experts, device="cuda", generator=g).topk(top_k, dim=-1).indices.to(dtype)
    got, want = moe_routing(index, experts), _moe_routing.torch_routing(index, experts)
    for name in ("sorted_ids", "perm", "inv", "offsets"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert got.offsets.dtype == torch.int32 and got.sorted_ids.dtype == dtype
    if tokens:  # expert parallel: the upper half of the ids are another rank's (sentinels E .. 2E-1)
        local = experts // 2
        got, want = moe_routing(index, local), _moe_routing.torch_routing(index, local)
        ends = int(want.offsets[-1])
        assert torch.equal(got.offsets, want.offsets)
        assert torch.equal(got.perm[:ends], want.perm[:ends])
        assert torch.equal(got.sorted_ids[:ends], want.sorted_ids[:ends])
        assert torch.equal(got.perm[got.inv], torch.arange(index.numel(), device="cuda"))  # inv inverts perm
        assert bool((got.sorted_ids[ends:] >= local).all())


@native
def test_native_routing_takes_less_gpu_time_than_torch_s_sort():
    """GPU time of the routing (CUDA events around 50 calls in a CUDA graph), native against
    torch's sort, searchsorted and scatter, at a DeepSeek-V2-Lite layer's 512 tokens (64 experts,
    top 6) and a Qwen3-235B layer's 4096 (128 experts, top 8)."""
    for experts, tokens, top_k in ((64, 512, 6), (128, 4096, 8)):
        index = torch.rand(tokens, experts, device="cuda").topk(top_k, dim=-1).indices
        times = {}
        for name, fn in (("native", moe_routing), ("torch", _moe_routing.torch_routing)):
            fn(index, experts)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(50):
                    fn(index, experts)
            graph.replay()
            samples = []
            for _ in range(5):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1000 / 50)
            times[name] = sorted(samples)[2]
        print(f"routing {tokens} tokens x top {top_k} over {experts} experts: native {times['native']:.1f} us, "
              f"torch {times['torch']:.1f} us a call")
        assert times["native"] < times["torch"], times


@native
def test_native_ops_refuse_bad_input_with_one_line():
    x = torch.randn(4, 16, device="cuda")
    inv = torch.arange(8, device="cuda")
    with pytest.raises(RuntimeError, match="weights must be float32"):
        torch.ops.cutlass_tune.moe_combine(x.repeat(2, 1), inv, torch.ones(8, device="cuda", dtype=torch.half), 2)
    with pytest.raises(RuntimeError, match="inv must be 1-D int64"):
        torch.ops.cutlass_tune.moe_gather(x, inv.int(), None, 2)
    with pytest.raises(RuntimeError, match="not a multiple of top_k"):
        torch.ops.cutlass_tune.moe_gather(x, inv[:7], None, 2)
    with pytest.raises(RuntimeError, match="expert ids must be int64 or int32"):
        torch.ops.cutlass_tune.moe_route(inv.float(), 4)
    with pytest.raises(RuntimeError, match="more than the routing kernel holds"):
        torch.ops.cutlass_tune.moe_route(inv, 5000)


@native
def test_native_ops_under_compile_and_in_a_cuda_graph():
    torch._dynamo.reset()
    index = torch.rand(64, 8, device="cuda").topk(2, dim=-1).indices
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.rand(64, 2, device="cuda", requires_grad=True)

    def fn(x, w, index):
        r = moe_routing(index, 8)
        return moe_combine(moe_gather(x, r) * 2, r, w)

    got = torch.compile(fn, fullgraph=True)(x, w, index)
    got.float().sum().backward()
    grads = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    want = fn(x, w, index)
    want.float().sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grads[0], x.grad)
    torch.testing.assert_close(grads[1], w.grad)
    with torch.no_grad():
        fn(x, w, index)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(x, w, index)
        index.copy_(torch.rand(64, 8, device="cuda").topk(2, dim=-1).indices)
        graph.replay()
        torch.testing.assert_close(out, fn(x, w, index))


def _torch_rows(name, t, r, weights):
    """The torch path of the operator `name` (differentiable by torch's own autograd)."""
    rows = _moe_routing._torch_combine if name == "moe_combine" else _moe_routing._torch_gather
    return rows(t, r.perm, r.inv, weights, r.top_k)


@native
@pytest.mark.nvcc
@pytest.mark.parametrize("name", ["moe_gather", "moe_combine"])
def test_native_autograd_is_the_librarys_cxx_kernel(name):
    """Guards the Python autograd kernel (register_autograd) running on every call, no_grad too."""
    table = torch._C._dispatch_dump(f"cutlass_tune::{name}")
    autograd = [line for line in table.splitlines() if line.startswith("Autograd[alias]:")]
    assert len(autograd) == 1 and "ops.cpp" in autograd[0] and "unboxed" in autograd[0], table
    index = torch.rand(16, 8, device="cuda").topk(2, dim=-1).indices
    r = moe_routing(index, 8)
    t = torch.randn(16 if name == "moe_gather" else 32, 64, device="cuda", requires_grad=True)
    w = torch.rand(16, 2, device="cuda", requires_grad=True)
    out = getattr(torch.ops.cutlass_tune, name)(t, r.inv, w, 2)
    assert "MoeRowsFunction" in out.grad_fn.name()
    with torch.no_grad():
        assert getattr(torch.ops.cutlass_tune, name)(t, r.inv, w, 2).grad_fn is None


@native
@pytest.mark.nvcc
@pytest.mark.parametrize("name", ["moe_gather", "moe_combine"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("grads", ["both", "rows", "weights", "unweighted"])
def test_native_gradients_match_the_torch_path(name, dtype, grads):
    tokens, top_k, hidden = 96, 2, 256
    index = torch.rand(tokens, 8, device="cuda").topk(top_k, dim=-1).indices
    r = moe_routing(index, 8)
    t0 = torch.randn(tokens * (top_k if name == "moe_combine" else 1), hidden, device="cuda", dtype=dtype)
    w0 = torch.rand(tokens, top_k, device="cuda")
    grad = torch.randn(tokens * (1 if name == "moe_combine" else top_k), hidden, device="cuda", dtype=dtype)
    results = []
    for run in ("native", "function", "torch"):
        t = t0.clone().requires_grad_(grads != "weights")
        w = None if grads == "unweighted" else w0.clone().requires_grad_(grads != "rows")
        if run == "native":
            out = getattr(torch.ops.cutlass_tune, name)(t, r.inv, w, top_k)
        elif run == "function":  # the package's function takes the operator and its C++ autograd
            out = (moe_combine if name == "moe_combine" else moe_gather)(t, r, w)
            assert "MoeRowsFunction" in out.grad_fn.name()
        else:
            out = _torch_rows(name, t, r, w)
        out.backward(grad)
        results.append((out.detach(), t.grad, None if w is None else w.grad))
    (out, d_t, d_w), function, (want, want_t, want_w) = results
    for got, same in zip((out, d_t, d_w), function, strict=True):
        assert (got is None and same is None) or torch.equal(got, same)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out, want, **tol)
    assert (d_t is None) == (want_t is None) and (d_w is None) == (want_w is None)
    if d_t is not None:
        torch.testing.assert_close(d_t, want_t, **tol)
    if d_w is not None:
        assert d_w.dtype == torch.float32
        torch.testing.assert_close(d_w.reshape(want_w.shape), want_w, rtol=1e-2, atol=5e-2)


def test_module_form_matches_the_function():
    x, index, weights, gate_up, down = operands(tokens=128)
    layer = cutlass_tune.nn.MoEExperts(gate_up, down, table=None)
    with torch.no_grad():
        assert torch.equal(layer(x, index, weights), moe_experts(x, index, weights, gate_up, down, table=None))


# ---------------------------------------------------------------------------------------------
# Decode: the batched GEMMs


def torch_batched_layer(x, index, weights, gate_up, down):
    """transformers' "batched_mm" experts forward on the same weights."""
    from types import SimpleNamespace

    transformers = pytest.importorskip("transformers", minversion="5")
    experts = SimpleNamespace(num_experts=E, has_gate=True, has_bias=False, is_transposed=False,
                              has_post_expert_norm=False, _is_expert_parallel=False, gate_up_proj=gate_up,
                              down_proj=down, act_fn=torch.nn.functional.silu)
    experts._apply_gate = lambda h: transformers.integrations.moe._default_apply_gate(experts, h)
    return transformers.integrations.moe.batched_mm_experts_forward(experts, x, index, weights)


@pytest.mark.parametrize("tokens", [1, 8, 64])
def test_batched_decode_matches_transformers_batched_mm(tokens):
    x, index, weights, gate_up, down = operands(tokens=tokens)
    with torch.no_grad():
        got = moe_experts(x, index, weights, gate_up, down, table=None, decode="batched")
        close(got, torch_batched_layer(x, index, weights, gate_up, down), name="batched_mm")
        close(got, moe_experts(x, index, weights, gate_up, down, table=None, decode="grouped"), name="grouped")


def test_batched_decode_has_no_host_sync_and_replays_new_routing_in_a_cuda_graph():
    x, index, weights, gate_up, down = operands(tokens=4)
    with torch.no_grad():
        moe_experts(x, index, weights, gate_up, down, table=None, decode="batched")
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            moe_experts(x, index, weights, gate_up, down, table=None, decode="batched")
        finally:
            torch.cuda.set_sync_debug_mode("default")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = moe_experts(x, index, weights, gate_up, down, table=None, decode="batched")
        x2, index2, weights2, _, _ = operands(tokens=4, seed=1)
        x.copy_(x2)
        index.copy_(index2)
        weights.copy_(weights2)
        graph.replay()
        close(out, torch_batched_layer(x, index, weights, gate_up, down))


@pytest.mark.nvcc
def test_auto_decode_under_torch_compile_takes_each_path_by_token_count(monkeypatch):
    """Guards the decode choice reading a device value (a host sync, or one graph for both)."""
    monkeypatch.setenv("CUTLASS_TUNE_MOE_BATCHED_ROWS", str(8 * TOP_K))
    from cutlass_tune.runtime import _moe

    taken = []
    bmm, grouped = _moe._bmm, _moe._grouped
    monkeypatch.setattr(_moe, "_bmm", lambda *a: taken.append("batched") or bmm(*a))
    monkeypatch.setattr(_moe, "_grouped", lambda *a: taken.append("grouped") or grouped(*a))
    torch._dynamo.reset()
    key = register_table(experts_table(), key="moe-gpu")
    compiled = torch.compile(lambda *t: moe_experts(*t, table=key), fullgraph=True)
    with torch.no_grad():
        for tokens, path in ((8, "batched"), (TOKENS, "grouped")):
            taken.clear()
            x, index, weights, gate_up, down = operands(tokens=tokens)
            got = compiled(x, index, weights, gate_up, down)
            assert taken == [path, path]  # traced once per path
            close(got, torch_layer(x, index, weights, gate_up, down), name=path)


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_biased_clamped_swiglu_layer_matches_the_float64_reference_on_cuda(expert_parallel):
    """GPT-OSS's form (biases, the clamped SwiGLU on interleaved columns, weights E x in x out)
    through the native glue, the down bias entering the combine as a tokens x experts product;
    with expert parallelism another rank's slots (ids past the experts) add nothing, bias included."""
    from cutlass_tune.runtime._moe import SWIGLU_OAI

    from .test_moe import reference

    experts, hidden, inter, top_k, tokens = 8, 256, 128, 4, 96
    g = torch.Generator().manual_seed(3)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    weights, index = torch.randn(tokens, experts, generator=g).softmax(-1).topk(top_k, dim=-1)
    if expert_parallel:
        index[::3, 0] = experts + 1  # another rank's expert
    gate_up = (torch.randn(experts, hidden, 2 * inter, generator=g) / 16).to(torch.bfloat16)
    down = (torch.randn(experts, inter, hidden, generator=g) / 16).to(torch.bfloat16)
    b1 = (torch.randn(experts, 2 * inter, generator=g) / 4).to(torch.bfloat16)
    b2 = (torch.randn(experts, hidden, generator=g) / 4).to(torch.bfloat16)
    leaves = [t.cuda().requires_grad_(t.is_floating_point()) for t in (x, weights, gate_up, down, b1, b2)]
    got = moe_experts(leaves[0], index.cuda(), leaves[1], leaves[2], leaves[3], table=None, activation=SWIGLU_OAI,
                      gate_up_bias=leaves[4], down_bias=leaves[5], transposed=True, expert_parallel=expert_parallel)
    kept = index < experts
    want = reference(x, index.clamp(max=experts - 1), weights * kept, gate_up, down, SWIGLU_OAI, b1, b2,
                     transposed=True)
    close(got.cpu(), want)
    got.float().square().sum().backward()
    assert leaves[5].grad is not None and torch.isfinite(leaves[5].grad).all()
    # the down bias's gradient: sum over tokens of 2 out[t] * (sum of the weights of its slots routed to e)
    per_expert = torch.zeros(tokens, experts, dtype=torch.float64).scatter_add(
        1, index.clamp(max=experts - 1), (weights * kept).double())
    close(leaves[5].grad.cpu(), per_expert.t() @ (2 * got.detach().cpu().double()), name="down bias")
