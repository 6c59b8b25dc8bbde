"""torch.ops.cutlass_tune.mm: registration, fake shapes, autograd and torch.compile on the CPU
(torch's GEMM computes there); the tuned kernels against torch, compiled and in CUDA graphs on a
Hopper GPU."""

import threading
import warnings

import pandas as pd
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import cutlass_tune
from cutlass_tune.runtime import BestTable, UnregisteredTableError, mm, register_table
from cutlass_tune.space import layout_code

from .tables import csv_table, tuned_table

OP = torch.ops.cutlass_tune.mm.default


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    table = csv_table(tmp_path_factory.mktemp("op") / "best.csv", [("bf16", "tn", 128, 64, 32)])
    return register_table(table, key="test-op")


def test_the_operator_is_registered_for_cpu_cuda_fake_and_autograd():
    assert str(OP._schema) == "cutlass_tune::mm(Tensor a, Tensor b, str table, ScalarType? out_dtype=None) -> Tensor"
    for dispatch_key in ("CPU", "CUDA", "Meta", "Autograd"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key("cutlass_tune::mm", dispatch_key), dispatch_key
    assert getattr(mm, "_opoverload", mm) is OP  # the public name is the operator (custom_op's, or the native one)
    if hasattr(torch.Tag, "needs_exact_strides"):
        assert torch.Tag.needs_exact_strides in OP.tags


def _weight_t(n, k, dtype):
    return torch.randn(n, k, dtype=dtype, requires_grad=True).t()


CASES = {
    "linear N-D": lambda dt: ((torch.randn(2, 3, 32, dtype=dt, requires_grad=True), _weight_t(64, 32, dt)), {}),
    "linear 1-D": lambda dt: ((torch.randn(32, dtype=dt, requires_grad=True), _weight_t(64, 32, dt)), {}),
    "column-major a": lambda dt: ((torch.randn(32, 16, dtype=dt).t().requires_grad_(),
                                   torch.randn(32, 24, dtype=dt, requires_grad=True)), {}),
    "float32 result": lambda dt: ((torch.randn(8, 32, dtype=dt, requires_grad=True), _weight_t(64, 32, dt)),
                                  {"out_dtype": torch.float32}),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_opcheck_schema_fake_autograd_and_aot_dispatch(key, case, dtype):
    (a, b), kwargs = CASES[case](dtype)
    torch.library.opcheck(OP, (a, b, key), kwargs)


def test_fake_shapes_and_dtypes_of_nd_inputs(key):
    with FakeTensorMode():
        x = torch.empty(2, 7, 5, 32, dtype=torch.bfloat16)
        w = torch.empty(64, 32, dtype=torch.bfloat16)
        y = OP(x, w.t(), key)
        assert (y.shape, y.dtype, y.is_contiguous()) == ((2, 7, 5, 64), torch.bfloat16, True)
        assert OP(x, w.t(), key, torch.float32).dtype == torch.float32
        assert OP(x[0, 0, 0], w.t(), key).shape == (64,)
        fp8 = OP(x.to(torch.float8_e4m3fn), w.t().to(torch.float8_e4m3fn), key)
        assert (fp8.shape, fp8.dtype) == ((2, 7, 5, 64), torch.bfloat16)
        with pytest.raises(RuntimeError, match=r"do not multiply"):
            OP(x, w, key)
        with pytest.raises(RuntimeError, match="they must match"):
            OP(x, w.t().half(), key)


def test_an_unregistered_key_fails_when_traced_and_when_run():
    x = torch.randn(4, 8)
    with pytest.raises(UnregisteredTableError, match="no table is registered under 'nowhere'"):
        OP(x, x.t(), "nowhere")
    with FakeTensorMode(), pytest.raises(UnregisteredTableError, match="call cutlass_tune.register_table"):
        OP(torch.empty(4, 8), torch.empty(8, 4), "nowhere")


def test_register_table_keys(tmp_path):
    table = BestTable(pd.DataFrame())
    first = register_table(table)
    assert register_table(table) == first and first.startswith("table-")
    assert register_table(table, key="named") == "named" and register_table(table) in (first, "named")
    other = BestTable(pd.DataFrame())
    assert register_table(other, key="named") == "named"  # rebound
    assert cutlass_tune.runtime._op.registered_table("named") is other
    path = tmp_path / "best.csv"
    csv_table(path, [("bf16", "tn", 128, 64, 32)])
    assert register_table(str(path)) == register_table(path)  # a path is loaded once
    with pytest.raises(ValueError, match="non-empty string"):
        register_table(table, key="")


def test_cpu_results_are_torch_s(key):
    a = torch.randn(3, 5, 32, dtype=torch.bfloat16)
    w = torch.randn(64, 32, dtype=torch.bfloat16)
    assert torch.equal(OP(a, w.t(), key), torch.matmul(a, w.t()))
    got = OP(a, w.t(), key, torch.float32)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, a.float() @ w.float().t())


def test_gradients_are_those_of_torch_and_land_in_each_operand_s_layout(key):
    # dW must come back N x K row-major like the weight (computed as dY^T @ X), not as a
    # transposed K x N that autograd would copy.
    x = torch.randn(2, 6, 32, dtype=torch.float64, requires_grad=True)
    w = torch.randn(64, 32, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 6, 64, dtype=torch.float64)
    OP(x, w.t(), key).backward(dy)
    got = x.grad, w.grad
    x.grad = w.grad = None
    torch.nn.functional.linear(x, w).backward(dy)
    torch.testing.assert_close(got, (x.grad, w.grad))
    assert got[1].is_contiguous()
    a = torch.randn(32, 16, dtype=torch.float64).t().requires_grad_()  # column-major a
    b = torch.randn(32, 24, dtype=torch.float64, requires_grad=True)
    OP(a, b, key).sum().backward()
    assert a.grad.t().is_contiguous() and b.grad.is_contiguous()
    torch.testing.assert_close(a.grad, torch.ones(16, 24, dtype=torch.float64) @ b.detach().t())


class _Calls(TorchDispatchMode):
    """The layouts (BLAS letters: t row-major, n column-major) of every cutlass_tune.mm call made
    under it."""

    def __init__(self):
        super().__init__()
        self.layouts = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is OP:
            a, b = args[0].reshape(-1, args[0].shape[-1]), args[1]
            self.layouts.append("".join("t" if t.is_contiguous() else "n" for t in (a, b)))
        return func(*args, **(kwargs or {}))


def test_a_linear_backward_calls_the_operator_in_tt_and_nt(key):
    # Which tuned layouts serve a Linear: tn forward, tt for dX = dY @ W, nt for dW = dY^T @ X.
    x = torch.randn(4, 32, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(64, 32, dtype=torch.bfloat16, requires_grad=True)
    with _Calls() as calls:
        OP(x, w.t(), key).sum().backward()
    assert calls.layouts == ["tn", "tt", "nt"]


def test_compiles_with_no_graph_break_and_matches_eager(key):
    w = torch.randn(64, 32, requires_grad=True)
    bias = torch.randn(64, requires_grad=True)

    def layer(x):
        return torch.nn.functional.gelu(OP(x, w.t(), key) + bias)

    assert torch._dynamo.explain(layer)(torch.randn(2, 3, 32)).graph_break_count == 0
    x = torch.randn(2, 3, 32, requires_grad=True)
    compiled = torch.compile(layer, fullgraph=True)
    compiled(x).square().sum().backward()
    got = x.grad, w.grad, bias.grad
    x.grad = w.grad = bias.grad = None
    layer(x).square().sum().backward()
    # Inductor fuses GELU's backward and rounds in another order than eager: fp32 rounding, not 1e-5
    torch.testing.assert_close(got, (x.grad, w.grad, bias.grad), rtol=1e-4, atol=1e-4)


def test_matmul_under_torch_compile_is_one_operator_call_and_no_graph_break(key):
    """The function `matmul` traced by Dynamo: `torch.ops.cutlass_tune.matmul` on the table's key
    (its CPU kernel computes torch's path here), every argument kept, and no graph break."""
    from cutlass_tune.runtime._op import registered_table

    table = registered_table(key)
    w, bias, c = torch.randn(32, 16), torch.randn(16), torch.randn(8, 16)

    def layer(x, table):
        return cutlass_tune.matmul(x, w, table, bias=bias, activation="relu", c=c, alpha=0.5, beta=2.0) * 3

    x = torch.randn(8, 32)
    assert torch._dynamo.explain(layer)(x, table).graph_break_count == 0
    got = torch.compile(layer, fullgraph=True)(x, table)
    torch.testing.assert_close(got, torch.relu(0.5 * (x @ w) + 2.0 * c + bias) * 3, rtol=1e-4, atol=1e-4)
    # a registered key and a table object reach the same table; another object, its own key
    for given in (key, BestTable(table.frame)):
        torch.testing.assert_close(torch.compile(layer, fullgraph=True)(x, given), got, rtol=1e-4, atol=1e-4)
    # a table object in a closure: bound at trace time to its trace_key, read as a constant
    held = BestTable(table.frame)
    closure = torch.compile(lambda x: layer(x, held), fullgraph=True)
    torch.testing.assert_close(closure(x), got, rtol=1e-4, atol=1e-4)
    assert registered_table(held.trace_key) is held and held.trace_key != BestTable(table.frame).trace_key


def test_matmul_under_torch_compile_runs_mm_or_scaled_mm_where_they_compute_the_same(key):
    """Traced, `matmul`'s plain 16-bit product is the `mm` operator on a key held to the call's
    min_ratio (C++ and Inductor's extern kernel where the library is loaded, where the `matmul`
    operator's kernel is Python), fp8 with scales at the default min_ratio the `scaled_mm`
    operator; any other call stays the `matmul` operator."""
    from cutlass_tune.runtime import _op

    table = _op.registered_table(key)
    graphs = []

    def backend(gm, inputs):
        graphs.append([n.target for n in gm.graph.nodes if n.op == "call_function"])
        return gm

    a, w = torch.randn(8, 32, dtype=torch.bfloat16), torch.randn(32, 16, dtype=torch.bfloat16)
    plain = torch.compile(lambda a: cutlass_tune.matmul(a, w, table, min_ratio=1.02), backend=backend, fullgraph=True)
    torch.testing.assert_close(plain(a), a @ w)
    assert graphs[-1] == [torch.ops.cutlass_tune.mm.default]
    (held,) = [k for k, (_, ratio) in _op._held.items() if ratio == 1.02]
    assert held.endswith("@min_ratio=1.02") and _op.registered_table(held) is table
    base = _op._held[held][0]
    other = BestTable(table.frame)
    _op.register_table(other, key=base)  # a key rebound: the key held from it follows
    assert _op.registered_table(held) is other
    _op.register_table(table, key=base)
    assert _op.registered_table(held) is table
    a8 = torch.randn(8, 32).to(torch.float8_e4m3fn)
    b8 = torch.randn(16, 32).to(torch.float8_e4m3fn).t()
    sa, sb = torch.rand(8, 1) + 0.5, torch.rand(1, 16) + 0.5
    scaled = torch.compile(lambda a: cutlass_tune.matmul(a, b8, table, scale_a=sa, scale_b=sb), backend=backend,
                           fullgraph=True)
    got, want = scaled(a8), (a8.float() * sa) @ (b8.float() * sb)
    assert graphs[-1] == [torch.ops.cutlass_tune.scaled_mm.default] and got.dtype == torch.bfloat16
    assert ((got.float() - want).norm() / want.norm()).item() < 1e-2
    bias = torch.randn(16, dtype=torch.bfloat16)
    for other in (lambda a: cutlass_tune.matmul(a, w, table, bias=bias),  # an epilogue
                  lambda a: cutlass_tune.matmul(a, w, table, out_dtype=torch.float32),  # another result type
                  lambda a: cutlass_tune.matmul(a8, b8, table, scale_a=sa, scale_b=sb, min_ratio=0.5)):
        torch.compile(other, backend=backend, fullgraph=True)(a)
        assert torch.ops.cutlass_tune.matmul.default in graphs[-1], graphs[-1]


def test_the_matmul_operator_checks_schema_and_fake_shapes(key):
    from cutlass_tune.runtime._op import matmul_op

    assert str(matmul_op._schema).startswith("cutlass_tune::matmul(Tensor a, Tensor b, str table, ScalarType? "
                                             "out_dtype, Tensor? bias, str activation")
    torch.library.opcheck(matmul_op, (torch.randn(4, 8), torch.randn(8, 6), key, None, torch.randn(6), "gelu", None,
                                      1.0, None, None, None, None, 1.0), test_utils=("test_schema", "test_faketensor"))
    with FakeTensorMode():
        a8 = torch.empty(4, 32, dtype=torch.float8_e4m3fn)
        out = matmul_op(a8, torch.empty(32, 16, dtype=torch.float8_e4m3fn), key, None, None, "none", None, 1.0,
                        None, torch.empty(4, 1), torch.empty(1, 16), None, 1.0)
        assert out.shape == (4, 16) and out.dtype == torch.bfloat16  # fp8 in: bfloat16 out, as matmul gives


# On a Hopper GPU: the tuned kernels (compiled on first use) against torch.

def _relative_error(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


@pytest.fixture(scope="module")
def tuned():
    table = tuned_table()
    return table, register_table(table, key="test-op-tuned")


def _tuned_layouts(table):
    """The layouts of the problems the table's matmul ran through a tuned kernel."""
    return {layout_code(p.problem.layout_a, p.problem.layout_b) for p, gemm, _ in table.plans.entries()
            if gemm is not None}


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("tokens", [(4, 256), (100,)])
def test_forward_and_backward_run_tuned_kernels_and_match_torch(tuned, tokens):
    table, key = tuned
    x = torch.randn(*tokens, 1024, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    w = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    dy = torch.randn(*tokens, 1024, dtype=torch.bfloat16, device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = OP(x, w.t(), key)
        y.backward(dy)
    assert not [str(c.message) for c in caught if "cutlass_tune" in str(c.message)]  # no fallback to torch
    assert _tuned_layouts(table) >= {"tn", "tt", "nt"}
    x2, dy2 = x.detach().reshape(-1, 1024).float(), dy.reshape(-1, 1024).float()
    assert y.shape == (*tokens, 1024) and y.dtype == torch.bfloat16
    assert _relative_error(y, x.detach().float() @ w.detach().float().t()) < 1e-2
    assert _relative_error(x.grad, dy.float() @ w.detach().float()) < 1e-2
    assert _relative_error(w.grad, dy2.t() @ x2) < 1e-2 and w.grad.is_contiguous()


@pytest.mark.gpu
@pytest.mark.nvcc
def test_a_thread_that_ran_no_cuda_work_initializes_kernels(tuned):
    # Regression: autograd's backward thread had no current CUDA context, so the kernel's TMA
    # descriptors failed (CUDA_ERROR_INVALID_CONTEXT) and the launch hit an illegal instruction.
    _, key = tuned
    x = torch.randn(512, 1024, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda")
    got = []
    worker = threading.Thread(target=lambda: got.append(OP(x, w.t(), key)))
    worker.start()
    worker.join()
    torch.cuda.synchronize()
    assert _relative_error(got[0], x.float() @ w.float().t()) < 1e-2


@pytest.mark.gpu
@pytest.mark.nvcc
def test_compiled_fullgraph_matches_eager_on_cuda(tuned):
    _, key = tuned
    w = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    bias = torch.randn(1024, dtype=torch.bfloat16, device="cuda", requires_grad=True)

    def layer(x):
        return OP(x, w.t(), key) + bias

    x = torch.randn(8, 128, 1024, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    compiled = torch.compile(layer, fullgraph=True)
    got = compiled(x)
    got.float().square().sum().backward()
    grads = x.grad, w.grad, bias.grad
    x.grad = w.grad = bias.grad = None
    want = layer(x)
    want.float().square().sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
    for g, e in zip(grads, (x.grad, w.grad, bias.grad)):
        assert _relative_error(g, e) < 1e-2


@pytest.mark.gpu
@pytest.mark.nvcc
def test_compiled_matmul_runs_the_tuned_kernel_as_eager_matmul_does(tuned):
    table, _ = tuned
    a = torch.randn(256, 1024, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda").t()
    want = cutlass_tune.matmul(a, w, table)
    compiled = torch.compile(lambda a: cutlass_tune.matmul(a, w, table) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(a), want * 2, rtol=0, atol=0)  # the same path, bit for bit


SIZES = [pytest.param(1024, id="persistent"), pytest.param(8192, id="stream-k")]
"""Square problems whose tuned tn kernel (sweep-nvidia-h200) is persistent (no workspace) and
Stream-K (a workspace zeroed before every launch)."""


def _runs_scheduler(table, size, scheduler):
    return any(g is not None and p.problem.m == size and g.config.tile_scheduler.value == scheduler
               for p, g, _ in table.plans.entries())


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("size", SIZES)
def test_a_cuda_graph_replays_the_tuned_kernel_on_new_inputs(tuned, size):
    table, key = tuned
    x = torch.randn(size, size, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(size, size, dtype=torch.bfloat16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernel loaded before capture
        OP(x, w.t(), key)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = OP(x, w.t(), key)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, OP(x, w.t(), key))
        assert _relative_error(y, x.float() @ w.float().t()) < 1e-2
    assert _runs_scheduler(table, size, "stream_k" if size == 8192 else "persistent")


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("size", SIZES)
def test_compiled_with_cuda_graphs_reduce_overhead(tuned, size):
    # Regression: a workspace kept past the first call sat untracked in the graphs' memory pool,
    # which torch.compile's CUDA graphs refuse ("tensor(s) in the cudagraph pool not tracked").
    _, key = tuned
    w = torch.randn(size, size, dtype=torch.bfloat16, device="cuda")

    @torch.compile(mode="reduce-overhead", fullgraph=True)
    def layer(x):
        return torch.relu(OP(x, w.t(), key))

    for _ in range(4):
        x = torch.randn(size, size, dtype=torch.bfloat16, device="cuda")
        got = layer(x).clone()
        assert torch.equal(got, torch.relu(OP(x, w.t(), key)))


@pytest.mark.gpu
def test_inputs_no_kernel_takes_are_computed_by_torch_with_one_warning(key):
    a = torch.randn(64, 32, device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = OP(a, a.t(), key)
        OP(a, a.t(), key)
    assert torch.equal(got, torch.matmul(a, a.t()))
    assert sum("cutlass_tune.mm" in str(c.message) and "float32" in str(c.message) for c in caught) == 1
    empty = torch.empty(0, 32, dtype=torch.bfloat16, device="cuda")
    assert OP(empty, torch.randn(32, 64, dtype=torch.bfloat16, device="cuda"), key).shape == (0, 64)


def test_checks_run_once_per_call_signature_and_every_new_one_is_checked():
    # Guards the operators' host fast path: a repeated call skips its checks, and a call whose
    # tensors differ in any way a check reads (shape, strides, dtype, device) is checked again.
    from cutlass_tune.runtime import _op

    seen = []

    def check(x, weight, activation):
        seen.append((tuple(x.shape), activation))
        _op._check_linear(x, weight, None, activation)

    x, w = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(16, 8, dtype=torch.bfloat16)
    for _ in range(3):
        _op._check_once(check, x, w, "relu")
    assert seen == [((4, 8), "relu")]
    _op._check_once(check, x.t().contiguous().t(), w, "relu")  # same shape, other strides
    assert len(seen) == 2
    with pytest.raises(RuntimeError, match="do not multiply"):
        _op._check_once(check, torch.randn(4, 9, dtype=torch.bfloat16), w, "relu")
    with pytest.raises(RuntimeError, match="activation 'tanh' is not one of"):
        _op._check_once(check, x, w, "tanh")
    with pytest.raises(RuntimeError, match="activation 'tanh' is not one of"):  # a failed check is not remembered
        _op._check_once(check, x, w, "tanh")
