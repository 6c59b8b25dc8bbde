"""The MoE experts' weight gradient through a table's tuned weight-gradient kernels
(`Grouping.GROUPED_K`): `grouped_weight_grad(g, x, offs, table=...)` computes dW_e = g_e^T x_e,
what torch's backward of a grouped GEMM runs as torch._grouped_mm(g.t(), x, offs).

    g: M x N row-major, the output gradient, rows sorted by expert (the forward's routing)
    x: M x K row-major, the forward's input rows, in the same order
    offs: E int32 cumulative row ends on g's device (the forward's)
    dW: E x N x K contiguous, like an E x N x K stack of nn.Linear-style weights; an expert
        without rows gets zeros

It dispatches as `grouped_mm` does (`resolve`: the table's rows of this operation and experts,
the nearest routed rows, `min_ratio`, the regime and in-model figures, one warning per fallback
cause) and, like it, reads `offs` on the device only: no host sync, so CUDA graphs capture it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch._C._autograd import _profiler_enabled

from ..tables import PROFILER_RANGE
from ._dispatch import Call, Kind, prepare, table_of
from ._grouped import _run_ready, weight_grad_problem_of
from ._matmul import _MIN_RATIO, MatmulInputError
from ._table import BestTable


def grouped_weight_grad(g: torch.Tensor, x: torch.Tensor, offs: torch.Tensor, *, table: BestTable | str | Path,
                        keep_workspace: bool = True, min_ratio: float = _MIN_RATIO) -> torch.Tensor:
    """dW_e = g_e^T x_e of every expert, E x N x K, by the table's tuned weight-gradient kernel
    for these experts (see the module docstring for the operands).

    The table's weight-gradient rows (grouping "grouped-k", layout nt) of the same dtype, experts
    E, N and K are looked up; the one whose routed rows are nearest M runs. Where the table has
    none, where that row's ratio to torch's grouped GEMM is below `min_ratio`, or where CUTLASS
    cannot run the problem, torch computes it (`torch._grouped_mm(g.t(), x, offs)`) and a
    warning says so once per cause. For the weights of a grouped GEMM `a @ b[e]`: with b the
    `w.transpose(-2, -1)` view of an E x N x K stack, dW = grouped_weight_grad(dY, a, offs); with
    b a contiguous E x K x N stack, dB = grouped_weight_grad(a, dY, offs) (E x K x N).

    Args:
        g: M x N row-major, bfloat16 or float16.
        x: M x K row-major of g's dtype, the same rows. N and K multiples of 8.
        offs: E int32 cumulative row ends, on g's device.
        table: a `BestTable`, or what `BestTable.load` reads (loaded once per path).
        keep_workspace: keep one workspace per thread, device and stream (outside CUDA graph
            capture and torch.compile's CUDA graph trees) instead of one per call.
        min_ratio: run torch's where the table's row measured the kernel at less than this ratio
            to it (a row with no ratio counts as below); 0 runs every kernel the table has.

    Returns:
        E x N x K of g's dtype, contiguous.

    Raises:
        MatmulInputError: operands that are not CUDA tensors, unsupported or mixed dtypes, rows
            that differ, offs that are not int32 values, N or K not multiples of 8, misaligned or
            strided operands.
    """
    for name, t in (("g", g), ("x", x), ("offs", offs)):
        if not isinstance(t, torch.Tensor):
            raise MatmulInputError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    return run_weight_grad(table if type(table) is BestTable else table_of(table), g, x, offs, keep_workspace,
                           min_ratio)


def run_weight_grad(table: BestTable, g: torch.Tensor, x: torch.Tensor, offs: torch.Tensor, keep_workspace: bool,
                    min_ratio: float, check: Callable[[], None] | None = None) -> torch.Tensor:
    """`grouped_weight_grad` on a loaded table, for its callers' hot path (the operator's):
    `check`, if given, runs only where the call's signature has no plan yet (a signature found
    there passed it once)."""
    device = g.get_device()
    signature = ("grouped-k", device, g.shape, x.shape, g.stride(), x.stride(), g.dtype, x.dtype, offs.shape,
                 offs.dtype, min_ratio, keep_workspace)
    ready = table.plans.get(signature)
    call = None
    if ready is None or not (device >= 0 and x.get_device() == device and offs.get_device() == device
                             and g.data_ptr() % 16 == 0 and x.data_ptr() % 16 == 0):
        if check is not None:
            check()
        call = Call(Kind.GROUPED, weight_grad_problem_of(g, x, offs), device, min_ratio, signature, keep_workspace)
        ready = prepare(table, call)
    if _profiler_enabled():  # `tune-model` reads each problem's kernel time from this range
        with torch.profiler.record_function(PROFILER_RANGE + ready.plan.problem.name):
            return _run_ready(table, ready, call, g, x, offs, keep_workspace, min_ratio, signature, None, None)
    return _run_ready(table, ready, call, g, x, offs, keep_workspace, min_ratio, signature, None, None)

