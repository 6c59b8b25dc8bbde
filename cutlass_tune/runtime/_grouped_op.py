"""The tuned grouped GEMM as a PyTorch operator, for MoE experts inside models:

    grouped_mm(Tensor a, Tensor b, Tensor offs, str table, ScalarType? out_dtype=None) -> Tensor

torch._grouped_mm's 2D x 3D case (`cutlass_tune.grouped_mm`'s operands): `a` M x K routed rows
sorted by expert, `b` E x K x N, `offs` E int32 row ends; the result M x N. `table` is a key from
`register_table`, as for `torch.ops.cutlass_tune.mm`, so torch.compile traces the call with no
graph break.

On CUDA it runs `grouped_mm` (the table's tuned grouped kernel for these experts, torch's
grouped GEMM where it has none, where the table measured it slower than torch's (min_ratio 1.0),
or where the tensors are ones no kernel takes, with one warning per cause), keeping a workspace
per stream as `grouped_mm` does: none in CUDA graph capture nor on the stream of torch.compile's
CUDA graph trees. Off CUDA torch computes it, so that registration, shapes and gradients can be
checked on any machine.

Where the operators' native library is built (`_native`), the operator is its: the CUDA and
Autograd kernels are C++ (the same plans, launched with no Python per call; `_grouped_mm_cuda`
below runs only for calls the C++ side hands back; a C++ autograd Function computes the backward
below), and this module attaches the fake, the CPU kernel and the backward below. Elsewhere
`torch.library.custom_op` defines it here.

Backward (`register_autograd`):
- dA = dY @ B_e^T per group: the same operator on `b.transpose(-2, -1)`, a grouped problem
  with N and K swapped and the other layout of B (the E x N x K weight stack of a "tn" call is
  a contiguous "tt" operand), so a table with those grouped kernels serves it.
- dB_e = A_e^T @ dY_e: the operator `grouped_weight_grad` below, two 2-D operands grouped
  along K, in b's layout: for the transposed view of a weight stack (`_weights_view`, nn.Linear
  style) dW_e = dY_e^T @ A_e lands E x N x K like the weights and is handed back transposed;
  for a contiguous E x K x N stack A_e^T @ dY_e lands E x K x N as it is.

    grouped_weight_grad(Tensor g, Tensor x, Tensor offs, str table) -> Tensor

dW_e = g_e^T x_e (E x N x K) by the table's tuned weight-gradient kernel (`Grouping.GROUPED_K`,
`cutlass_tune.grouped_weight_grad`) where the dispatcher picks one as it does the forward's
(min_ratio 1.0, one warning per fallback cause), else what torch._grouped_mm's own backward runs,
torch._grouped_mm(g.t(), x, offs). It reads offs on the device only (CUDA graphs, torch.compile's
AOTAutograd backward). Defined here with both kinds of `grouped_mm` (the native library's C++
backward calls it through the dispatcher); its own backward (a double backward) is `grouped_mm`'s.
"""

from __future__ import annotations

from typing import Any

import torch

from ..space import Activation
from . import _lowering, _native
from ._dispatch import OUT_DTYPES, Call, Kind, input_not_taken, prepare
from ._grouped import grouped_problem_of, run_grouped, torch_grouped_mm, torch_weight_grad
from ._matmul import MatmulInputError
from ._op import _TAGS, _on_device_of, registered_table
from ._weight_grad import run_weight_grad


def _check(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype | None) -> None:
    """What every implementation (fake and real) refuses, with what to fix."""
    torch._check(a.dim() == 2, lambda: f"cutlass_tune.grouped_mm: a must be 2-D (M x K), not {a.dim()}-D")
    torch._check(b.dim() == 3, lambda: f"cutlass_tune.grouped_mm: b must be 3-D (E x K x N), not {b.dim()}-D")
    torch._check(a.shape[1] == b.shape[1],
                 lambda: f"cutlass_tune.grouped_mm: a {tuple(a.shape)} and b {tuple(b.shape)} do not multiply")
    torch._check(offs.dim() == 1 and offs.shape[0] == b.shape[0] and offs.dtype == torch.int32,
                 lambda: f"cutlass_tune.grouped_mm: offs must be {b.shape[0]} int32 row ends, not {offs.dtype} of "
                 f"shape {tuple(offs.shape)}")
    torch._check(a.dtype == b.dtype,
                 lambda: f"cutlass_tune.grouped_mm: a is {a.dtype} and b is {b.dtype}: they must match")
    torch._check(not a.dtype.is_floating_point or a.element_size() > 1,
                 lambda: f"cutlass_tune.grouped_mm: the operator takes no fp8 scales ({a.dtype}): call "
                 "cutlass_tune.grouped_mm(a, b, offs, table=, scale_a=, scale_b=)")
    torch._check(a.device == b.device == offs.device,
                 lambda: f"cutlass_tune.grouped_mm: a, b and offs are on {a.device}, {b.device} and {offs.device}")
    torch._check(out_dtype is None or out_dtype in OUT_DTYPES,
                 lambda: f"cutlass_tune.grouped_mm: out_dtype {out_dtype} is not supported (bfloat16, float16, "
                 "float32)")


def _grouped_mm_cuda(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, table: str,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """out[offs[e-1]:offs[e]] = a[offs[e-1]:offs[e]] @ b[e] by the tuned grouped kernels of the
    table registered under `table` (CUDA tensors).

    Args:
        a: M x K, bfloat16 or float16 for a tuned kernel, rows sorted by expert.
        b: E x K x N of a's dtype (`w.transpose(-2, -1)` of an E x N x K weight stack: "tn").
        offs: E int32 cumulative row ends.
        table: a key from `register_table`.
        out_dtype: the result's type; None: a's.

    Returns:
        M x N of `out_dtype`, contiguous.

    Raises:
        UnregisteredTableError: `table` is not a registered key.
        RuntimeError: shapes that do not multiply, offs of another length or dtype, mixed dtypes
            or devices, fp8 inputs (their block-wise scales go through `cutlass_tune.grouped_mm`).
    """
    tuned = registered_table(table)
    with _on_device_of(a):
        try:
            # `_check` only for shapes not seen yet: torch._check costs more than the rest of a call.
            return run_grouped(tuned, a, b, offs, out_dtype, True, 1.0, lambda: _check(a, b, offs, out_dtype))
        except MatmulInputError as err:
            input_not_taken("grouped_mm", err, "torch's grouped GEMM")
            return torch_grouped_mm(a, b, offs, out_dtype)


def _signature(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype | None) -> tuple:
    """`run_grouped`'s plan-cache key of an operator call (min_ratio 1, a kept workspace)."""
    return ("grouped", a.get_device(), a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, offs.shape,
            offs.dtype, out_dtype, None, None, 1.0, True, Activation.NONE)


def _resolve_native(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, table: str,
                    out_dtype: torch.dtype | None = None) -> tuple:
    """The native plan entry of an operator call's signature (`_native.plan_entry`): its kernel,
    torch's grouped GEMM where the table keeps torch and the result is a's type, else the door."""
    tuned = registered_table(table)
    _check(a, b, offs, out_dtype)
    try:
        problem = grouped_problem_of(a, b, offs, out_dtype)
    except MatmulInputError:
        return (_native.ENTRY_PYTHON,)  # the door says why once, and computes with torch
    signature = _signature(a, b, offs, out_dtype)
    with _on_device_of(a):
        ready = tuned.plans.get(signature) or prepare(tuned, Call(Kind.GROUPED, problem, a.get_device(), 1.0,
                                                                  signature, True))
    return _native.plan_entry(ready, torch_path=out_dtype in (None, a.dtype))


def _grouped_mm_cpu(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, table: str,
                    out_dtype: torch.dtype | None = None) -> torch.Tensor:
    # torch's grouped GEMM alone: no tuned kernel runs off CUDA. The key is still checked, so a
    # model run here finds a missing registration before it reaches a GPU.
    _check(a, b, offs, out_dtype)
    registered_table(table)
    return torch_grouped_mm(a, b, offs, out_dtype)


def _grouped_mm_fake(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, table: str,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    _lowering.ensure("grouped_mm")
    _check(a, b, offs, out_dtype)
    registered_table(table)  # a missing key fails when the graph is traced, not when it first runs
    return a.new_empty((a.shape[0], b.shape[2]), dtype=out_dtype or a.dtype)


def _weights_view(b: torch.Tensor) -> bool:
    """b is the transpose(-2, -1) of a contiguous E x N x K stack (nn.Linear-style weights)."""
    return not b.is_contiguous() and b.transpose(-2, -1).is_contiguous()


def _check_weight_grad(g: torch.Tensor, x: torch.Tensor, offs: torch.Tensor) -> None:
    """What every implementation of `grouped_weight_grad` (fake and real) refuses."""
    torch._check(g.dim() == 2 and x.dim() == 2 and g.shape[0] == x.shape[0],
                 lambda: f"cutlass_tune.grouped_weight_grad: g and x must be 2-D with the same rows (M x N and M x K), "
                 f"not {tuple(g.shape)} and {tuple(x.shape)}")
    torch._check(offs.dim() == 1 and offs.dtype == torch.int32,
                 lambda: f"cutlass_tune.grouped_weight_grad: offs must be E int32 row ends, not {offs.dtype} of shape "
                 f"{tuple(offs.shape)}")
    torch._check(g.dtype == x.dtype,
                 lambda: f"cutlass_tune.grouped_weight_grad: g is {g.dtype} and x is {x.dtype}: they must match")
    torch._check(g.device == x.device == offs.device,
                 lambda: f"cutlass_tune.grouped_weight_grad: g, x and offs are on {g.device}, {x.device} and "
                 f"{offs.device}")


def _weight_grad_cuda(g: torch.Tensor, x: torch.Tensor, offs: torch.Tensor, table: str) -> torch.Tensor:
    """dW_e = g_e^T x_e (E x N x K) by the tuned weight-gradient kernels of the table registered
    under `table` (CUDA tensors), else torch's grouped GEMM (tensors no kernel takes: said once)."""
    tuned = registered_table(table)
    with _on_device_of(g):
        try:
            return run_weight_grad(tuned, g, x, offs, True, 1.0, lambda: _check_weight_grad(g, x, offs))
        except MatmulInputError as err:
            input_not_taken("grouped_weight_grad", err, "torch's grouped GEMM")
            return torch_weight_grad(g, x, offs)


def _weight_grad_cpu(g: torch.Tensor, x: torch.Tensor, offs: torch.Tensor, table: str) -> torch.Tensor:
    _check_weight_grad(g, x, offs)
    registered_table(table)
    return torch_weight_grad(g, x, offs)


def _weight_grad_fake(g: torch.Tensor, x: torch.Tensor, offs: torch.Tensor, table: str) -> torch.Tensor:
    _check_weight_grad(g, x, offs)
    registered_table(table)
    return g.new_empty((offs.shape[0], g.shape[1], x.shape[1]))


def _weight_grad_setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    g, x, offs, table = inputs
    needs_g, needs_x = ctx.needs_input_grad[:2]
    ctx.save_for_backward(g if needs_x else None, x if needs_g else None, offs)
    ctx.table = table


def _weight_grad_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None,
                                                                  None]:
    # dW_e = g_e^T x_e: dg_e = x_e dW_e^T and dx_e = g_e dW_e, grouped GEMMs of the forward's kind.
    g, x, offs = ctx.saved_tensors
    grad = grad.contiguous()
    needs_g, needs_x = ctx.needs_input_grad[:2]
    grad_g = grouped_mm_op(x, grad.transpose(-2, -1), offs, ctx.table) if needs_g else None
    grad_x = grouped_mm_op(g, grad, offs, ctx.table) if needs_x else None
    return grad_g, grad_x, None, None


def _setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    a, b, offs, table, _ = inputs
    needs_a, needs_b = ctx.needs_input_grad[:2]
    ctx.save_for_backward(a if needs_b else None, b if needs_a else None, offs)
    ctx.table, ctx.dtype, ctx.weights_view = table, a.dtype, _weights_view(b)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None]:
    a, b, offs = ctx.saved_tensors
    grad = grad.to(ctx.dtype).contiguous()
    needs_a, needs_b = ctx.needs_input_grad[:2]
    grad_a = grouped_mm_op(grad, b.transpose(-2, -1), offs, ctx.table) if needs_a else None
    grad_b = None
    if needs_b:  # in b's layout: an E x N x K weight stack's dW handed back as its transpose(-2, -1) view
        grad_b = grouped_weight_grad_op(grad, a, offs, ctx.table).transpose(-2, -1) if ctx.weights_view else \
            grouped_weight_grad_op(a, grad, offs, ctx.table)
    return grad_a, grad_b, None, None, None


if _native.load() is not None:
    grouped_mm_op: Any = torch.ops.cutlass_tune.grouped_mm.default
    """The operator (defined by the native library: its CUDA and Autograd kernels are C++)."""
    _lib = torch.library.Library("cutlass_tune", "IMPL")
    _lib.impl("grouped_mm", _grouped_mm_cpu, "CPU")
    torch.library.register_fake("cutlass_tune::grouped_mm", _grouped_mm_fake, lib=_lib)
    _native.register("grouped_mm", _resolve_native, _grouped_mm_cuda, _backward, _setup_context)
else:
    grouped_mm_op = torch.library.custom_op("cutlass_tune::grouped_mm", mutates_args=(), device_types="cuda",
                                            tags=_TAGS)(_grouped_mm_cuda)
    grouped_mm_op.register_kernel("cpu")(_grouped_mm_cpu)
    grouped_mm_op.register_fake(_grouped_mm_fake)
    grouped_mm_op.register_autograd(_backward, setup_context=_setup_context)

grouped_weight_grad_op: Any = torch.library.custom_op("cutlass_tune::grouped_weight_grad", mutates_args=(),
                                                      device_types="cuda", tags=_TAGS)(_weight_grad_cuda)
"""The weight-gradient operator (defined here where the native library is loaded too)."""
grouped_weight_grad_op.register_kernel("cpu")(_weight_grad_cpu)
grouped_weight_grad_op.register_fake(_weight_grad_fake)
grouped_weight_grad_op.register_autograd(_weight_grad_backward, setup_context=_weight_grad_setup_context)
