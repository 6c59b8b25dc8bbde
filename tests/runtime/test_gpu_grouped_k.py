"""The weight-gradient launch on a Hopper GPU: `GroupedGemm.run_weight_grad` (a `Grouping.GROUPED_K`
kernel, compiled on first use with nvcc) against torch._grouped_mm(g.t(), x, offs), the product
torch's backward of a grouped GEMM computes, and against fp32, with empty experts (exactly 0),
routed rows no tile divides, no rows at all, and a CUDA graph replayed over new offsets; then the
same kernel as a table's weight-gradient row, run by the backward of torch.ops.cutlass_tune.grouped_mm
(both layouts of b) and by the operator grouped_weight_grad in a CUDA graph.

Run on the GPU host: python3 -m pytest tests/runtime/test_gpu_grouped_k.py -m gpu -p no:cacheprovider -v"""

import warnings

import pytest
import torch

from cutlass_tune.runtime import register_table
from cutlass_tune.runtime._grouped import GroupedGemm, torch_weight_grad
from cutlass_tune.space import Grouping

from ..compile.test_nvcc_grouped_k import GROUPED_K
from .tables import weight_grad_table

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

N, K = 1536, 4096  # the down projection's dW at Qwen3-235B's widths, transposed: G 1536 wide, X 4096
ROWS = (0, 3, 130, 0, 1025, 64, 7, 0)
TOLERANCE = 1e-2


@pytest.fixture(scope="module")
def gemm():
    return GroupedGemm(GROUPED_K[0])


def _operands(rows, seed=0):
    gen = torch.Generator("cuda").manual_seed(seed)
    m = sum(rows)
    g = (torch.randn(m, N, generator=gen, device="cuda") * 0.1).bfloat16()
    x = (torch.randn(m, K, generator=gen, device="cuda") * 0.1).bfloat16()
    offs = torch.tensor(rows, dtype=torch.int32, device="cuda").cumsum(0).to(torch.int32)
    return g, x, offs


def _fp32(g, x, rows):
    out, start = [], 0
    for count in rows:
        out.append(g[start:start + count].float().t() @ x[start:start + count].float())
        start += count
    return torch.stack(out)


def _rel(got, want):
    return float(torch.linalg.vector_norm(got.float() - want) / torch.linalg.vector_norm(want))


def _assert_experts(got, want, rows):
    """Each expert's dW within TOLERANCE of fp32, an expert without rows exactly 0."""
    for e, count in enumerate(rows):
        if count:
            assert _rel(got[e], want[e]) < TOLERANCE, (e, count)
        else:
            assert int((got[e] != 0).sum()) == 0, f"expert {e} has no rows: its dW must be 0"


def test_the_kernel_matches_torch_and_fp32_and_zeroes_empty_experts(gemm):
    g, x, offs = _operands(ROWS)
    out = torch.full((len(ROWS), N, K), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert gemm.run_weight_grad(g, x, offs, out) is out
    torch.cuda.synchronize()
    want = _fp32(g, x, ROWS)
    _assert_experts(out, want, ROWS)
    used = torch.tensor([c > 0 for c in ROWS], device="cuda")
    assert _rel(out[used], torch_weight_grad(g, x, offs).float()[used]) < TOLERANCE


def test_no_rows_at_all_give_zeros_without_a_launch(gemm):
    g, x = torch.empty(0, N, dtype=torch.bfloat16, device="cuda"), torch.empty(0, K, dtype=torch.bfloat16,
                                                                                device="cuda")
    offs = torch.zeros(4, dtype=torch.int32, device="cuda")
    out = gemm.run_weight_grad(g, x, offs)
    torch.cuda.synchronize()
    assert out.shape == (4, N, K) and int((out != 0).sum()) == 0


def test_a_graph_replay_reads_the_new_offsets(gemm):
    rows_again = (7, 0, 1000, 200, 0, 19, 0, 3)
    assert sum(rows_again) == sum(ROWS)
    g, x, offs = _operands(ROWS)
    out = torch.empty(len(ROWS), N, K, dtype=torch.bfloat16, device="cuda")
    gemm.run_weight_grad(g, x, offs, out)  # compiled and initialized outside the capture
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        gemm.run_weight_grad(g, x, offs, out)
    offs.copy_(torch.tensor(rows_again, dtype=torch.int32, device="cuda").cumsum(0))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    want = _fp32(g, x, rows_again)
    _assert_experts(out, want, rows_again)


@pytest.fixture
def launches(monkeypatch):
    """The problems of the weight-gradient kernels `GroupedGemm.launch` ran (the dispatcher's
    launches, whichever door they came through)."""
    ran = []
    launch = GroupedGemm.launch

    def counted(self, plan, *args, **kwargs):
        if plan.problem.grouping is Grouping.GROUPED_K:
            ran.append(plan.problem)
        return launch(self, plan, *args, **kwargs)

    monkeypatch.setattr(GroupedGemm, "launch", counted)
    return ran


def _table_key(name):
    # the rows of both layouts' problems: dW of E x N x K weights (n N, k K), dB of E x K x N ones
    rows = sum(ROWS)
    table = weight_grad_table([(len(ROWS), N, K, rows, 1.5), (len(ROWS), K, N, rows, 1.5)], config=GROUPED_K[0])
    return table, register_table(table, key=name)


@pytest.mark.parametrize("layout", ["tn", "tt"])
def test_the_backward_of_grouped_mm_runs_the_tuned_weight_gradient(launches, layout):
    table, key = _table_key(f"gpu-wgrad-{layout}")
    grad, a, offs = _operands(ROWS, seed=1)
    gen = torch.Generator("cuda").manual_seed(2)
    shape = (len(ROWS), N, K) if layout == "tn" else (len(ROWS), K, N)
    w = (torch.randn(*shape, generator=gen, device="cuda") * 0.05).bfloat16().requires_grad_(True)
    b = w.transpose(-2, -1) if layout == "tn" else w
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.ops.cutlass_tune.grouped_mm(a, b, offs, key).backward(grad)  # the forward is torch's: no row of it
        torch.cuda.synchronize()
    assert not [str(c.message) for c in caught if "grouped_weight_grad" in str(c.message)]
    n, k = (N, K) if layout == "tn" else (K, N)
    assert [(p.n, p.k) for p in launches] == [(n, k)], "the table's weight-gradient kernel computed dB"
    assert any(r.gemm is not None and r.plan.problem.grouping is Grouping.GROUPED_K for r in table.plans.entries())
    want = _fp32(grad, a, ROWS) if layout == "tn" else _fp32(a, grad, ROWS)
    assert w.grad.shape == w.shape and w.grad.is_contiguous()
    _assert_experts(w.grad, want, ROWS)
    torch_grad = torch_weight_grad(grad, a, offs) if layout == "tn" else torch_weight_grad(a, grad, offs)
    used = torch.tensor([c > 0 for c in ROWS], device="cuda")
    assert _rel(w.grad[used], torch_grad.float()[used]) < TOLERANCE


def test_the_operator_in_a_cuda_graph_reads_the_new_offsets(launches):
    """Guards the backward's weight gradient under CUDA graph capture: no host sync, offs read on the device."""
    _, key = _table_key("gpu-wgrad-graph")
    rows_again = (7, 0, 1000, 200, 0, 19, 0, 3)
    g, x, offs = _operands(ROWS)
    op = torch.ops.cutlass_tune.grouped_weight_grad
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(g, x, offs, key)  # resolved and initialized outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(g, x, offs, key)
    offs.copy_(torch.tensor(rows_again, dtype=torch.int32, device="cuda").cumsum(0))
    graph.replay()
    torch.cuda.synchronize()
    assert len(launches) == 2
    want = _fp32(g, x, rows_again)
    _assert_experts(out, want, rows_again)
