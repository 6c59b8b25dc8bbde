"""The weight gradient's dispatch on the CPU: `cutlass_tune.grouped_weight_grad` and the operator
grouped_weight_grad that grouped_mm's backward runs, looked up in a real table of weight-gradient
rows (`resolve`), the kernel library replaced at its ctypes boundary by test_grouped_launch.py's
recorder and CPU tensors passing for CUDA ones of an H200. The kernels run in
test_gpu_grouped_k.py."""

import warnings

import pytest
import torch

import cutlass_tune
from cutlass_tune.runtime import (
    MatmulInputError,
    _dispatch,
    _grouped,
    _grouped_op,
    _matmul,
    _native,
    _weight_grad,
    register_table,
)
from cutlass_tune.space import DType, Grouping, Layout, Problem
from cutlass_tune.tables import BundledKernel

from .tables import weight_grad_table
from .test_grouped_launch import FakeKernel, Log

E, N, K = 4, 16, 32
OFFS = (5, 5, 12, 24)  # expert 1 gets no rows
M = OFFS[-1]


def _posed(g, x, offs):
    """`weight_grad_problem_of` but for the device (CPU tensors here)."""
    return Problem.experts(offs.shape[0], g.shape[1], x.shape[1], g.shape[0], dtype_a=DType.BF16, dtype_b=DType.BF16,
                           dtype_d=DType.BF16, layout_a=Layout.COL, layout_b=Layout.ROW, grouping=Grouping.GROUPED_K)


@pytest.fixture
def faked(monkeypatch):
    """An H200 of 132 SMs as device 0, kernels loaded as `FakeKernel`s; `faked.torch` records the
    calls that torch computed."""
    FakeKernel.log = Log()
    monkeypatch.setattr(_matmul, "LoadedKernel", FakeKernel)
    monkeypatch.setattr(_grouped, "current_stream", lambda device: 7)
    monkeypatch.setattr(_grouped, "bind_primary_context", lambda device: None)
    monkeypatch.setattr(_grouped, "sm_count", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(_weight_grad, "weight_grad_problem_of", _posed)
    monkeypatch.setattr(_dispatch, "_warned", set())
    computed = []

    def by_torch(g, x, offs):
        computed.append((g, x))
        return torch.zeros(offs.shape[0], g.shape[1], x.shape[1], dtype=g.dtype)

    monkeypatch.setattr(_grouped, "torch_weight_grad", by_torch)
    _dispatch.clear_loaded()
    yield computed
    _dispatch.clear_loaded()


def table_of(entries):
    table = weight_grad_table(entries)
    table.bundled = {h: BundledKernel("unused.so", "k0") for h in table.frame["config_hash"]}
    return table


def operands(layout):
    torch.manual_seed(0)
    a = torch.randn(M, K, dtype=torch.bfloat16)
    w = torch.randn(E, N, K, dtype=torch.bfloat16) if layout == "tn" else torch.randn(E, K, N, dtype=torch.bfloat16)
    w.requires_grad_(True)
    return a, w, (w.transpose(-2, -1) if layout == "tn" else w), torch.tensor(OFFS, dtype=torch.int32)


def kernel_plans(table):
    return [r for r in table.plans.entries() if r.gemm is not None and r.plan.problem.grouping is Grouping.GROUPED_K]


@pytest.mark.skipif(_native.available(), reason="the native library's C++ backward calls the operator itself")
@pytest.mark.parametrize("layout", ["tn", "tt"])
def test_the_backward_runs_the_tables_weight_gradient_row_of_its_problem(faked, monkeypatch, layout):
    # The operator's CUDA kernel on CPU tensors: the backward's dB goes through its dispatch.
    monkeypatch.setattr(_grouped_op, "grouped_weight_grad_op", _grouped_op._weight_grad_cuda)
    table = table_of([(E, N, K, M, 1.2), (E, K, N, M, 1.3)])  # dW of E x N x K weights; dB of E x K x N ones
    key = register_table(table, key=f"wgrad-{layout}")
    a, w, b, offs = operands(layout)
    grad = torch.randn(M, N, dtype=torch.bfloat16)
    torch.ops.cutlass_tune.grouped_mm(a, b, offs, key).backward(grad)
    # tn: dW = dY_e^T A_e (g = dY, N x K); tt: dB = A_e^T dY_e (g = A, K x N)
    n, k = (N, K) if layout == "tn" else (K, N)
    [(_, _, args, _, _)] = FakeKernel.log.of("initialize")
    assert (args["m"], args["n"], args["k"], args["groups"]) == (M, n, k, E)
    assert (args["b"] == a.data_ptr()) is (layout == "tn") and (args["a"] == a.data_ptr()) is (layout == "tt")
    [ready] = kernel_plans(table)
    assert (ready.plan.problem.n, ready.plan.problem.k, ready.plan.ratio) == (n, k, 1.2 if layout == "tn" else 1.3)
    assert not faked and w.grad.shape == w.shape and w.grad.is_contiguous()


def test_no_row_of_the_problem_falls_back_to_torch_once(faked):
    table = table_of([(E, N, 2 * K, M, 1.2), (2 * E, N, K, M, 1.2)])  # other experts' weight gradients
    key = register_table(table, key="wgrad-none")
    a, g, offs = torch.randn(M, K).bfloat16(), torch.randn(M, N).bfloat16(), torch.tensor(OFFS, dtype=torch.int32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            _grouped_op._weight_grad_cuda(g, a, offs, key)
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and said[0].startswith("cutlass_tune.grouped_weight_grad: ") and "torch's" in said[0]
    assert len(faked) == 2 and not FakeKernel.log.of("run")


@pytest.mark.parametrize(("ratio", "min_ratio", "runs"), [(1.2, 1.0, True), (0.97, 1.0, False), (0.97, 0.9, True)])
def test_a_row_below_min_ratio_keeps_torch(faked, ratio, min_ratio, runs):
    table = table_of([(E, N, K, M, ratio)])
    a, g, offs = torch.randn(M, K).bfloat16(), torch.randn(M, N).bfloat16(), torch.tensor(OFFS, dtype=torch.int32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [cutlass_tune.grouped_weight_grad(g, a, offs, table=table, min_ratio=min_ratio) for _ in range(2)]
    assert len(FakeKernel.log.of("run")) == (2 if runs else 0) and len(faked) == (0 if runs else 2)
    assert all(out.shape == (E, N, K) for out in outs)
    said = [str(w.message) for w in caught if "min_ratio" in str(w.message)]
    assert len(said) == (0 if runs else 1) and (runs or "0.970x torch's grouped GEMM" in said[0])


def test_no_routed_rows_give_zeros_without_a_launch(faked):
    table = table_of([(E, N, K, M, 1.2)])
    g, x = torch.empty(0, N, dtype=torch.bfloat16), torch.empty(0, K, dtype=torch.bfloat16)
    out = cutlass_tune.grouped_weight_grad(g, x, torch.zeros(E, dtype=torch.int32), table=table)
    assert out.shape == (E, N, K) and not out.any() and not FakeKernel.log.of("initialize") and not faked


def test_what_the_door_cannot_take_is_one_line():
    table = table_of([(E, N, K, M, 1.2)])
    with pytest.raises(MatmulInputError, match="x must be a torch.Tensor, not list"):
        cutlass_tune.grouped_weight_grad(torch.ones(M, N), [1], torch.tensor(OFFS, dtype=torch.int32), table=table)
    with pytest.raises(MatmulInputError, match="CUDA device") as err:
        cutlass_tune.grouped_weight_grad(torch.ones(M, N).bfloat16(), torch.ones(M, K).bfloat16(),
                                         torch.tensor(OFFS, dtype=torch.int32), table=table)
    assert "\n" not in str(err.value)
