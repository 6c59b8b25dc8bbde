"""The tuned GEMM as PyTorch operators, for use inside models: `torch.ops.cutlass_tune.mm` and
the fused linear layer `torch.ops.cutlass_tune.linear`.

    mm(Tensor a, Tensor b, str table, ScalarType? out_dtype=None) -> Tensor
    linear(Tensor x, Tensor weight, Tensor? bias, str activation, str table, Tensor? residual=None,
           Tensor? gate=None) -> Tensor

`a` is [..., K] (any number of leading dimensions, as nn.Linear takes its input), `b` is K x N;
the result is [..., N], contiguous. A table cannot be an operator's argument: `register_table`
binds it to a key (a string), and the operator takes the key. A string argument is a constant to
torch.compile, so a graph calls the operator with no break, and the ctypes launch runs only inside
the operator's CUDA kernel, where Dynamo never looks.

On CUDA the operator runs `matmul` on `a` flattened to 2-D: the tuned kernel of the table for the
problem (or of the nearest tuned problem), torch's own GEMM where the table has nothing for the
dtypes and layout. Tensors no tuned kernel can take (float32, misaligned or strided operands, an
empty batch) are computed by torch's GEMM too, with one warning per cause: inside a model the
operator always gives a @ b. Off CUDA it computes with torch alone (tuned kernels run on CUDA);
that path exists so that registration, shapes and gradients can be checked on any machine.

Backward (`register_autograd`) runs the same operator on the layouts it needs: dA = dY @ B^T and
dB = A^T @ dY, each computed in its operand's layout (for nn.Linear's weight, dW = dY^T @ X lands
N x K row-major like the weight), so a table with tuned tt and nt kernels serves a Linear's
backward too, and torch's GEMM does where it has none.

Where the operators' native library is built (`_native`), `mm` and `linear` are its: their CUDA
and Autograd kernels are C++ (the plans launched with no Python per call, torch's path for a
linear the table has no kernel for included; `mm_direct` and `linear_direct` run only for calls
the C++ side hands back; the backward formulas below are computed by C++ autograd Functions that
mirror them), and this module attaches the fakes, the CPU kernels and the backward formulas (run
only for an activation the C++ side does not know). Elsewhere `torch.library.custom_op` defines
them here.

`linear` is activation(x @ weight^T + bias + residual) in one kernel, or with a `gate`
activation(gate) * (x @ weight^T + bias) (a gated MLP's up projection, the gate GEMM's output as
`gate`): the table's rows of that epilogue (bias+silu, gelu+residual, silu+gated, ...) for the
tn problem, torch's F.linear, add, activation and product where it has none. Its backward
needs what the fused kernel never writes: the pre-activation x @ weight^T + bias (+ residual)
under an activation, or the gated product's x @ weight^T + bias for the gate's gradient. It
recomputes it with `mm` (one more GEMM, no memory held between forward and backward), then
takes the activation's derivative as torch does and runs the gradient GEMMs as `mm`'s backward
does: d(residual) is the pre-activation's gradient, and gated d(up) = grad * activation(gate),
d(gate) = grad * up * activation'(gate). `cutlass_tune.nn.Linear` calls this operator only
where no gradient is needed, and `mm` followed by torch's bias add and activation where one is
(training keeps torch's saved pre-activation and pays no recomputation).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .._torch import FP8_DTYPES, backward_nodes
from ..errors import CutlassTuneError
from ..space import Activation, Epilogue, NodeKind, Problem
from . import _lowering, _native
from . import _matmul as _matmul_module
from ._dispatch import OUT_DTYPES, Call, Kind, input_not_taken, load_table, prepare
from ._matmul import _MIN_RATIO, MatmulInputError, beta_of, door_entry, matmul, problem_of, torch_gemm
from ._table import BestTable, traced_table


class UnregisteredTableError(CutlassTuneError, LookupError):
    """An operator call names a table key that `register_table` has not bound in this process."""


_tables: dict[str, BestTable] = {}
_lock = threading.Lock()
_held: dict[str, tuple[str, float]] = {}
"""Keys whose `mm` plans are held to a min_ratio, each with the key it was made from and the ratio:
those `compiled_matmul` binds for `matmul`'s calls (rebound with their key). Every other key's `mm`
and `linear` plans resolve at 0.0 (`patch` swapped the layer at its own)."""


_PLAIN_DTYPES = (torch.bfloat16, torch.float16)
"""Inputs whose plain product torch.mm computes where a plan is torch's (C++ calls it itself), and
which `compiled_matmul` hands to `mm`."""


def _held_ratio(key: str) -> float:
    held = _held.get(key)
    return 0.0 if held is None else held[1]


def register_table(table: BestTable | str | Path, key: str | None = None) -> str:
    """Bind a best-config table to a key that `torch.ops.cutlass_tune.mm` takes.

    The registry is per process: a module saved with its key needs the table registered under
    the same key (pass `key`) in the process that loads it. Thread-safe.

    Args:
        table: a `BestTable`, or what `BestTable.load` reads (a table file, a bundle, a store);
            a path is loaded once per process.
        key: the key to bind. None: a key this table already has, else a new one ("table-1",
            "table-2", ...). A key bound before is bound to `table` from now on, also for graphs
            compiled with it.

    Returns:
        The key.

    Raises:
        ValueError: `key` is empty or not a string.
        BestTableError, BundleError, StoreError: a path that cannot be read as a table.
    """
    if key is not None and (not isinstance(key, str) or not key):
        raise ValueError(f"a table key must be a non-empty string, not {key!r}")
    loaded = table if isinstance(table, BestTable) else load_table(str(table))
    with _lock:
        if key is None:
            key = next((k for k, t in _tables.items() if t is loaded), None)
        if key is None:
            key = next(f"table-{n}" for n in itertools.count(len(_tables) + 1) if f"table-{n}" not in _tables)
        _tables[key] = loaded
        held = [(h, ratio) for h, (base, ratio) in _held.items() if base == key]
        for h, _ in held:  # `matmul`'s traced keys follow the key they were made from
            _tables[h] = loaded
    _native.bind(key, loaded)  # the key's calls use `loaded`'s own plans (kept across rebinding)
    for h, ratio in held:
        _native.bind(h, loaded, ratio)
    return key


def table_key(table: BestTable | str | Path) -> str:
    """The key of `table`: a registered key as it is, a table or a path registered (see
    `register_table`)."""
    if isinstance(table, str) and table in _tables:
        return table
    return register_table(table)


def registered_table(key: str) -> BestTable:
    """The table bound to `key`. Raises UnregisteredTableError naming the keys there are."""
    table = _tables.get(key)
    if table is None:
        bound = ", ".join(repr(k) for k in sorted(_tables)) or "none"
        raise UnregisteredTableError(f"no table is registered under {key!r} in this process (registered: {bound}): "
                                     "call cutlass_tune.register_table(table, key=...) first")
    return table


def result_dtype(a: torch.dtype, out_dtype: torch.dtype | None) -> torch.dtype:
    """The type of `mm`'s result: `out_dtype`, else bfloat16 for fp8 inputs, else the inputs'."""
    if out_dtype is not None:
        return out_dtype
    return torch.bfloat16 if a in FP8_DTYPES else a


def _check(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None) -> None:
    """What every implementation (fake and real) refuses, with what to fix."""
    torch._check(a.dim() >= 1, lambda: f"cutlass_tune.mm: a must have at least 1 dimension, not {a.dim()}")
    torch._check(b.dim() == 2, lambda: f"cutlass_tune.mm: b must be 2-D (K x N), not {b.dim()}-D")
    torch._check(a.shape[-1] == b.shape[0],
                 lambda: f"cutlass_tune.mm: a {tuple(a.shape)} and b {tuple(b.shape)} do not multiply")
    torch._check(a.dtype == b.dtype, lambda: f"cutlass_tune.mm: a is {a.dtype} and b is {b.dtype}: they must match")
    torch._check(a.device == b.device, lambda: f"cutlass_tune.mm: a is on {a.device} and b on {b.device}")
    torch._check(out_dtype is None or out_dtype in OUT_DTYPES,
                 lambda: f"cutlass_tune.mm: out_dtype {out_dtype} is not supported (bfloat16, float16, float32)")


_TAGS: Sequence[torch.Tag] = (torch.Tag.needs_exact_strides,) if hasattr(torch.Tag, "needs_exact_strides") else ()
"""Inductor hands the operator its operands with the strides eager code would: a tuned kernel is
picked by layout (row- or column-major), so a copy into another layout would pick another."""


def _mm_cuda(a: torch.Tensor, b: torch.Tensor, table: str, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """a @ b by the tuned kernels of the table registered under `table` (CUDA tensors).

    Args:
        a: [..., K], bfloat16, float16 or float8_e4m3fn for a tuned kernel (other dtypes, and
            operands a kernel cannot take, are computed by torch's GEMM).
        b: K x N of a's dtype (`weight.t()` for an nn.Linear weight: the "tn" layout).
        table: a key from `register_table`.
        out_dtype: the result's type; None: a's type (bfloat16 for fp8 inputs).

    Returns:
        [..., N] of `out_dtype`, contiguous.

    Raises:
        UnregisteredTableError: `table` is not a registered key.
        RuntimeError: shapes that do not multiply, mixed dtypes or devices (as torch's GEMM).
    """
    return mm_direct(a, b, table, out_dtype)


def mm_direct(a: torch.Tensor, b: torch.Tensor, table: str, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """`mm`'s CUDA kernel called without the operator's dispatch (see `linear_direct`)."""
    _check_once(_check, a, b, out_dtype)
    tuned = registered_table(table)
    dtype = result_dtype(a.dtype, out_dtype)
    a2 = a.reshape(-1, a.shape[-1])
    with _on_device_of(a):
        if a2.numel() == 0 or b.numel() == 0:
            product = torch_gemm(a2, b, dtype)
        else:
            try:  # patch held the table to its min_ratio; `matmul`'s traced calls hold their own (`_held`)
                product = matmul(a2, b, tuned, out_dtype, min_ratio=_held_ratio(table))
            except MatmulInputError as err:
                input_not_taken("mm", err, "torch's GEMM")
                product = torch_gemm(a2, b, dtype)
    return product.reshape(*a.shape[:-1], b.shape[1])


def _on_device_of(t: torch.Tensor) -> contextlib.AbstractContextManager:
    """The device guard torch's own operators take (a Python operator gets none): the kernel
    launches on the current device."""
    index = t.device.index
    if index is None or index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(index)


def _mm_cpu(a: torch.Tensor, b: torch.Tensor, table: str, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    # torch's GEMM alone: no tuned kernel runs off CUDA. The table key is still checked, so a
    # model that runs here finds a missing registration before it reaches a GPU.
    _check(a, b, out_dtype)
    registered_table(table)
    product = torch_gemm(a.reshape(-1, a.shape[-1]), b, result_dtype(a.dtype, out_dtype))
    return product.reshape(*a.shape[:-1], b.shape[1])


def _mm_fake(a: torch.Tensor, b: torch.Tensor, table: str, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    _lowering.ensure("mm")
    _check(a, b, out_dtype)
    registered_table(table)  # a missing key fails when the graph is traced, not when it first runs
    return a.new_empty((*a.shape[:-1], b.shape[1]), dtype=result_dtype(a.dtype, out_dtype))


def _column_major(t: torch.Tensor) -> bool:
    """A 2-D tensor stored transposed (the `weight.t()` of nn.Linear); a row-major one is not."""
    return t.dim() == 2 and not t.is_contiguous() and t.t().is_contiguous()


def _grad_a(grad: torch.Tensor, b: torch.Tensor, column_major: bool, table: str) -> torch.Tensor:
    """dA = dY @ B^T, in a's layout: a column-major `a` gets (B @ dY^T)^T."""
    if column_major:
        return mm(b, grad.t(), table).t()
    return mm(grad, b.t(), table)


def _grad_b(grad: torch.Tensor, a: torch.Tensor, column_major: bool, table: str) -> torch.Tensor:
    """dB = A^T @ dY over the flattened batch, in b's layout: a column-major `b` (a weight's
    transpose) gets (dY^T @ A)^T, so the weight's gradient is N x K row-major like the weight."""
    a2, grad2 = a.reshape(-1, a.shape[-1]), grad.reshape(-1, grad.shape[-1])
    if column_major:
        return mm(grad2.t(), a2, table).t()
    return mm(a2.t(), grad2, table)


def _setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    a, b, table, _ = inputs
    needs_a, needs_b = ctx.needs_input_grad[:2]
    ctx.save_for_backward(a if needs_b else None, b if needs_a else None)  # each gradient needs the other operand
    ctx.table, ctx.dtype = table, a.dtype
    ctx.a_column_major, ctx.b_column_major = _column_major(a), _column_major(b)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
    if ctx.dtype in FP8_DTYPES:
        raise NotImplementedError("cutlass_tune.mm has no backward for fp8 inputs (they need scaling)")
    a, b = ctx.saved_tensors
    # A result of another type (out_dtype) gives gradients of the inputs' type, through kernels
    # of that type; contiguous, as an expanded gradient (of a sum) is neither row- nor column-major.
    grad = grad.to(ctx.dtype).contiguous()
    needs_a, needs_b = ctx.needs_input_grad[:2]
    grad_a = _grad_a(grad, b, ctx.a_column_major, ctx.table) if needs_a else None
    grad_b = _grad_b(grad, a, ctx.b_column_major, ctx.table) if needs_b else None
    return grad_a, grad_b, None, None




_ACTIVATION_NAMES = tuple(a.value for a in Activation)


def _meta(t: torch.Tensor | None) -> tuple | None:
    """What a check of `t` reads: its shape, strides, dtype and device (None for None)."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.get_device())


_PASSED: set[tuple] = set()
"""The calls (`_meta` of each tensor, the other arguments) whose checks passed. A model repeats a
few shapes, and where the host is the bottleneck (a GEMM of 30 us behind a host path of 100)
every microsecond of a call is the GPU's idle time, so a repeated call skips its checks."""
_PASSED_MOST = 4096
"""Calls remembered before the set starts over (a model of ever-changing batch shapes)."""


def _check_once(check: Any, *args: Any) -> None:
    """`check(*args)`, unless a call with the same tensor metadata and arguments passed it before."""
    key = (check, *(_meta(a) if a is None or isinstance(a, torch.Tensor) else a for a in args))
    if key in _PASSED:
        return
    check(*args)
    if len(_PASSED) >= _PASSED_MOST:
        _PASSED.clear()
    _PASSED.add(key)


def _check_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str,
                  residual: torch.Tensor | None = None, gate: torch.Tensor | None = None) -> None:
    """What every implementation of `linear` (fake and real) refuses, with what to fix."""
    torch._check(x.dim() >= 1, lambda: f"cutlass_tune.linear: x must have at least 1 dimension, not {x.dim()}")
    torch._check(weight.dim() == 2, lambda: f"cutlass_tune.linear: weight must be 2-D (N x K), not {weight.dim()}-D")
    torch._check(x.shape[-1] == weight.shape[1], lambda: f"cutlass_tune.linear: x {tuple(x.shape)} and weight "
                 f"{tuple(weight.shape)} do not multiply (weight is out_features x in_features)")
    torch._check(x.dtype == weight.dtype,
                 lambda: f"cutlass_tune.linear: x is {x.dtype} and weight is {weight.dtype}: they must match")
    torch._check(x.dtype not in FP8_DTYPES, lambda: "cutlass_tune.linear: fp8 inputs need scales: call "
                 "cutlass_tune.matmul with scale_a and scale_b")
    torch._check(x.device == weight.device, lambda: f"cutlass_tune.linear: x is on {x.device} and weight on "
                 f"{weight.device}")
    torch._check(activation in _ACTIVATION_NAMES, lambda: f"cutlass_tune.linear: activation {activation!r} is not "
                 f"one of {', '.join(_ACTIVATION_NAMES)}")
    if bias is not None:
        torch._check(tuple(bias.shape) == (weight.shape[0],), lambda: f"cutlass_tune.linear: bias has shape "
                     f"{tuple(bias.shape)}; it must be ({weight.shape[0]},), one value per output feature")
        torch._check(bias.dtype == x.dtype,
                     lambda: f"cutlass_tune.linear: bias is {bias.dtype} and x is {x.dtype}: they must match")
        torch._check(bias.device == x.device, lambda: f"cutlass_tune.linear: bias is on {bias.device} and x on "
                     f"{x.device}")
    torch._check(residual is None or gate is None, lambda: "cutlass_tune.linear: residual and gate are both the "
                 "kernel's C: pass one")
    for name, t in (("residual", residual), ("gate", gate)):
        if t is not None:
            _check_like_output(name, t, x, (*x.shape[:-1], weight.shape[0]))


def _check_like_output(name: str, t: torch.Tensor, x: torch.Tensor, shape: tuple) -> None:
    """A residual or gate is the output's shape, of x's dtype and on x's device."""
    torch._check(tuple(t.shape) == shape, lambda: f"cutlass_tune.linear: {name} has shape {tuple(t.shape)}; "
                 f"it must be the output's, {shape}")
    torch._check(t.dtype == x.dtype,
                 lambda: f"cutlass_tune.linear: {name} is {t.dtype} and x is {x.dtype}: they must match")
    torch._check(t.device == x.device, lambda: f"cutlass_tune.linear: {name} is on {t.device} and x on {x.device}")


def _rows(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """A residual or gate as the M x N matrix of the flattened batch (a copy only where its
    strides do not allow a view)."""
    return None if t is None else t.reshape(-1, n)


def _torch_linear(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str,
                  residual: torch.Tensor | None = None, gate: torch.Tensor | None = None) -> torch.Tensor:
    """torch's own path for the same math (F.linear's addmm, + residual, the activation; gated,
    the activation of the gate times the product). `residual` and `gate` are M x N."""
    return torch_gemm(x2, weight.t(), x2.dtype, bias=None if bias is None else bias.contiguous(),
                      activation=activation, c=residual, beta=0.0 if residual is None else 1.0, gate=gate)


def _untuned_words(activation: str, residual: torch.Tensor | None, gate: torch.Tensor | None) -> str:
    if gate is not None:
        return f"torch's F.linear times {activation} of the gate"
    return "torch's F.linear" + (", residual add" if residual is not None else "") + f" and {activation}"


def _linear_cuda(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str, table: str,
           residual: torch.Tensor | None = None, gate: torch.Tensor | None = None) -> torch.Tensor:
    """activation(x @ weight^T + bias + residual), or activation(gate) * (x @ weight^T + bias),
    by the tuned fused kernels of the table registered under `table` (CUDA tensors): nn.Linear
    followed by its activation, a residual add or a gated MLP's product, in one kernel.

    Args:
        x: [..., K], bfloat16 or float16 for a tuned kernel (other dtypes, operands a kernel
            cannot take, and epilogues the table has not tuned are computed by torch).
        weight: N x K (nn.Linear's weight, out_features x in_features), x's dtype.
        bias: N values of x's dtype, or None.
        activation: an `Activation` or its name (none, relu, gelu: the erf form, ...).
        table: a key from `register_table`.
        residual: [..., N] of x's dtype, added before the activation (beta 1), or None.
        gate: [..., N] of x's dtype, the gate's pre-activation of a gated MLP (the gate
            projection's output): the activation applies to it and multiplies x @ weight^T +
            bias. Not with `residual`.

    Returns:
        [..., N] of x's dtype, contiguous.

    Raises:
        UnregisteredTableError: `table` is not a registered key.
        RuntimeError: shapes that do not multiply, mixed dtypes or devices, fp8 inputs, an
            unknown activation, a bias, residual or gate of another shape or dtype, both a
            residual and a gate.
    """
    return linear_direct(x, weight, bias, activation, table, residual, gate)


def linear_direct(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str, table: str,
                  residual: torch.Tensor | None = None, gate: torch.Tensor | None = None) -> torch.Tensor:
    """`linear`'s CUDA kernel called without the operator's dispatch, for eager code that needs no
    gradient (`cutlass_tune.nn.Linear`): the dispatcher's autograd, backend and aliasing layers
    cost more host time than a small GEMM's kernel takes. Same arguments and result."""
    _check_once(_check_linear, x, weight, bias, activation, residual, gate)
    tuned = registered_table(table)
    n = weight.shape[0]
    x2, residual2, gate2 = x.reshape(-1, x.shape[-1]), _rows(residual, n), _rows(gate, n)
    with _on_device_of(x):
        if x2.numel() == 0 or weight.numel() == 0:
            out = _torch_linear(x2, weight, bias, activation, residual2, gate2)
        else:
            try:
                out = matmul(x2, weight.t(), tuned, bias=bias, activation=activation, c=residual2, gate=gate2,
                             min_ratio=0.0)  # the layer was swapped for entries at patch's min_ratio
            except MatmulInputError as err:
                input_not_taken("linear", err, _untuned_words(activation, residual, gate))
                out = _torch_linear(x2, weight, bias, activation, residual2, gate2)
    return out.reshape(*x.shape[:-1], n)


def _linear_cpu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str, table: str,
                residual: torch.Tensor | None = None, gate: torch.Tensor | None = None) -> torch.Tensor:
    _check_linear(x, weight, bias, activation, residual, gate)
    registered_table(table)
    n = weight.shape[0]
    out = _torch_linear(x.reshape(-1, x.shape[-1]), weight, bias, activation, _rows(residual, n), _rows(gate, n))
    return out.reshape(*x.shape[:-1], n)


def _linear_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str, table: str,
                 residual: torch.Tensor | None = None, gate: torch.Tensor | None = None) -> torch.Tensor:
    _lowering.ensure("linear")
    _check_linear(x, weight, bias, activation, residual, gate)
    registered_table(table)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _linear_setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    x, weight, bias, activation, table, *rest = inputs
    residual, gate = (*rest, None, None)[:2]
    ctx.activation, ctx.table = Activation(activation), table
    # A residual is needed again only to recompute an activation's input; a gate always is.
    keep_residual = residual if ctx.activation is not Activation.NONE else None
    ctx.save_for_backward(x, weight, bias, keep_residual, gate)
    ctx.has_residual = residual is not None


def _linear_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    x, weight, bias, residual, gate = ctx.saved_tensors
    needs_x, needs_weight, needs_bias = ctx.needs_input_grad[:3]
    needs_residual, needs_gate = (*ctx.needs_input_grad[5:7], False, False)[:2]
    grad = grad.contiguous()

    def product() -> torch.Tensor:
        # The fused kernel kept no x @ weight^T + bias: recompute it (see the module docstring).
        z = mm(x, weight.t(), ctx.table)
        return z if bias is None else z + bias

    # The epilogue's nodes after the bias, each differentiated by its facet (`_torch.NODE_GRAD`).
    epilogue = Epilogue(activation=ctx.activation, residual=residual is not None, gated=gate is not None)
    tail = [node for node in epilogue.tree().walk() if node.kind not in _PRODUCT_NODES]
    grad, grads = backward_nodes(tail, grad, product, {"c": gate if gate is not None else residual},
                                 ("c",) if needs_gate and gate is not None else ())
    grad = grad.contiguous()
    grad_gate = grads["c"].contiguous() if "c" in grads else None
    grad_x = _grad_a(grad, weight.t(), False, ctx.table) if needs_x else None
    grad_weight = _grad_b(grad, x, True, ctx.table).t() if needs_weight else None
    grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0) if needs_bias and bias is not None else None
    grad_residual = grad if needs_residual and ctx.has_residual else None
    return grad_x, grad_weight, grad_bias, None, None, grad_residual, grad_gate


_PRODUCT_NODES = (NodeKind.ACCUMULATOR, NodeKind.SCALE, NodeKind.BIAS)
"""The nodes `_linear_backward`'s `product` recomputes: x @ weight^T + bias."""


def _dense_entry(table: BestTable, problem: Problem, a2: torch.Tensor, signature: tuple, torch_path: bool,
                 min_ratio: float = 0.0) -> tuple:
    """The native plan entry of a dense call (min_ratio 0: the layer was swapped at patch's)."""
    with _on_device_of(a2):
        ready = table.plans.get(signature) or prepare(table, Call(Kind.DENSE, problem, a2.get_device(), min_ratio,
                                                                  signature))
    return _native.plan_entry(ready, torch_path)


def _resolve_mm(a: torch.Tensor, b: torch.Tensor, table: str, out_dtype: torch.dtype | None = None) -> tuple:
    """The native plan entry of an `mm` call's signature: its kernel, torch.mm where the table
    keeps torch for 16-bit inputs of the result's type, else the door."""
    _check(a, b, out_dtype)
    tuned = registered_table(table)
    a2 = a.reshape(-1, a.shape[-1])
    if a2.numel() == 0 or b.numel() == 0:
        return (_native.ENTRY_PYTHON,)
    try:
        problem = problem_of(a2, b, out_dtype)
    except MatmulInputError:
        return (_native.ENTRY_PYTHON,)  # the door says why once, and computes with torch
    held = _held_ratio(table)
    signature = ("native mm", held, a2.get_device(), a2.shape, b.shape, a2.stride(), b.stride(), a.dtype, out_dtype)
    plain = a.dtype in _PLAIN_DTYPES and out_dtype in (None, a.dtype)
    return _dense_entry(tuned, problem, a2, signature, plain, held)


def _resolve_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str, table: str,
                    residual: torch.Tensor | None = None, gate: torch.Tensor | None = None) -> tuple:
    """The native plan entry of a `linear` call's signature: its kernel, else torch's path
    (`_torch_linear`, which C++ computes itself: the fallback said once here), else the door."""
    _check_linear(x, weight, bias, activation, residual, gate)
    tuned = registered_table(table)
    n = weight.shape[0]
    x2, residual2, gate2 = x.reshape(-1, x.shape[-1]), _rows(residual, n), _rows(gate, n)
    if x2.numel() == 0 or weight.numel() == 0:
        return (_native.ENTRY_PYTHON,)
    try:
        problem = problem_of(x2, weight.t(), bias=bias, activation=activation, c=residual2, gate=gate2)
    except MatmulInputError:
        return (_native.ENTRY_PYTHON,)
    signature = ("native linear", x2.get_device(), x2.shape, weight.shape, x2.stride(), weight.stride(), x.dtype,
                 activation, *(None if t is None else (t.shape, t.stride(), t.dtype) for t in (bias, residual2, gate2)))
    return _dense_entry(tuned, problem, x2, signature, True)


if _native.load() is not None:
    mm: Any = torch.ops.cutlass_tune.mm.default
    """a @ b by the tuned kernels of a registered table (`_mm_cuda`), defined by the native library."""
    linear: Any = torch.ops.cutlass_tune.linear.default
    """The fused linear layer (`_linear_cuda`), defined by the native library."""
    _lib = torch.library.Library("cutlass_tune", "IMPL")
    for _name, _cpu, _fake in (("mm", _mm_cpu, _mm_fake), ("linear", _linear_cpu, _linear_fake)):
        _lib.impl(_name, _cpu, "CPU")
        torch.library.register_fake(f"cutlass_tune::{_name}", _fake, lib=_lib)
    _native.register("mm", _resolve_mm, mm_direct, _backward, _setup_context)
    _native.register("linear", _resolve_linear, linear_direct, _linear_backward, _linear_setup_context)
else:
    mm = torch.library.custom_op("cutlass_tune::mm", mutates_args=(), device_types="cuda", tags=_TAGS)(_mm_cuda)
    mm.register_kernel("cpu")(_mm_cpu)
    mm.register_fake(_mm_fake)
    mm.register_autograd(_backward, setup_context=_setup_context)
    linear = torch.library.custom_op("cutlass_tune::linear", mutates_args=(), device_types="cuda",
                                     tags=_TAGS)(_linear_cuda)
    linear.register_kernel("cpu")(_linear_cpu)
    linear.register_fake(_linear_fake)
    linear.register_autograd(_linear_backward, setup_context=_linear_setup_context)


def _scaled_mm_cuda(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                    bias: torch.Tensor | None, table: str, out_dtype: torch.dtype) -> torch.Tensor:
    with _on_device_of(a):
        return matmul(a, b, registered_table(table), out_dtype, bias=bias, scale_a=scale_a, scale_b=scale_b)


def _scaled_mm_cpu(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                   bias: torch.Tensor | None, table: str, out_dtype: torch.dtype) -> torch.Tensor:
    registered_table(table)
    return torch_gemm(a, b, out_dtype, bias=bias, scale_a=scale_a, scale_b=scale_b)


def _scaled_mm_fake(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                    bias: torch.Tensor | None, table: str, out_dtype: torch.dtype) -> torch.Tensor:
    _lowering.ensure("scaled_mm")
    registered_table(table)
    torch._check(a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0],
                 lambda: f"cutlass_tune.scaled_mm: a {list(a.shape)} and b {list(b.shape)} do not chain")
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def _resolve_scaled(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                    bias: torch.Tensor | None, table: str, out_dtype: torch.dtype) -> tuple:
    """The native plan entry of a `scaled_mm` call's signature: the plan `matmul` makes for the
    same call (`door_entry`, at matmul's default min_ratio), its kernel, or torch._scaled_mm where
    the table keeps torch (C++ calls it, with fast accumulation where the fallback says so);
    block-wise scales and calls the checks refuse go to the Python kernel (`_scaled_mm_cuda`),
    which says why once."""
    tuned = registered_table(table)
    try:
        with _on_device_of(a):
            return door_entry(tuned, a, b, out_dtype, scale_a, scale_b, _MIN_RATIO, bias)
    except MatmulInputError:
        return (_native.ENTRY_PYTHON,)


def _matmul_cuda(a: torch.Tensor, b: torch.Tensor, table: str, out_dtype: torch.dtype | None,
                 bias: torch.Tensor | None, activation: str, c: torch.Tensor | None, alpha: float, beta: float | None,
                 scale_a: torch.Tensor | None, scale_b: torch.Tensor | None, gate: torch.Tensor | None,
                 min_ratio: float) -> torch.Tensor:
    with _on_device_of(a):
        return matmul(a, b, registered_table(table), out_dtype, bias=bias, activation=activation, c=c, alpha=alpha,
                      beta=beta, scale_a=scale_a, scale_b=scale_b, gate=gate, min_ratio=min_ratio)


def _matmul_cpu(a: torch.Tensor, b: torch.Tensor, table: str, out_dtype: torch.dtype | None,
                bias: torch.Tensor | None, activation: str, c: torch.Tensor | None, alpha: float, beta: float | None,
                scale_a: torch.Tensor | None, scale_b: torch.Tensor | None, gate: torch.Tensor | None,
                min_ratio: float) -> torch.Tensor:
    # torch's path for the same math, as the other operators' CPU kernels compute it (a graph
    # traced on a machine with no GPU runs); `matmul` itself takes CUDA tensors only.
    registered_table(table)
    return torch_gemm(a, b, result_dtype(a.dtype, out_dtype), bias=bias, activation=activation, c=c, alpha=alpha,
                      beta=beta_of(c, beta), scale_a=scale_a, scale_b=scale_b, gate=gate)


def _matmul_fake(a: torch.Tensor, b: torch.Tensor, table: str, out_dtype: torch.dtype | None,
                 bias: torch.Tensor | None, activation: str, c: torch.Tensor | None, alpha: float, beta: float | None,
                 scale_a: torch.Tensor | None, scale_b: torch.Tensor | None, gate: torch.Tensor | None,
                 min_ratio: float) -> torch.Tensor:
    registered_table(table)
    torch._check(a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0],
                 lambda: f"cutlass_tune.matmul: a {list(a.shape)} and b {list(b.shape)} must be M x K and K x N")
    return a.new_empty((a.shape[0], b.shape[1]), dtype=result_dtype(a.dtype, out_dtype))


_forward_libs: list[torch.library.Library] = []
"""The fragments `forward_op` defined (kept: a fragment dropped undefines its operator)."""


def forward_op(schema: str, cuda: Callable, cpu: Callable, fake: Callable) -> Any:
    """An inference operator of the cutlass_tune namespace with Python kernels (CUDA, CPU, fake) and
    no autograd kernel: defined with torch.library.Library, not custom_op, so the dispatcher calls
    its kernels straight away (about 2 us a call on a 2-core CPU host, where custom_op's autograd
    and checking layers cost 9: benchmarks/op_registration_cpu.py). Returns its default overload."""
    name = schema.split("(", 1)[0]
    lib = torch.library.Library("cutlass_tune", "FRAGMENT")
    lib.define(schema, tags=tuple(_TAGS))
    lib.impl(name, cuda, "CUDA")
    lib.impl(name, cpu, "CPU")
    torch.library.register_fake(f"cutlass_tune::{name}", fake, lib=lib)
    _forward_libs.append(lib)
    return getattr(torch.ops.cutlass_tune, name).default


if _native.load() is not None:
    scaled_mm_op: Any = torch.ops.cutlass_tune.scaled_mm.default
    _scaled_lib = torch.library.Library("cutlass_tune", "IMPL")
    _scaled_lib.impl("scaled_mm", _scaled_mm_cpu, "CPU")
    torch.library.register_fake("cutlass_tune::scaled_mm", _scaled_mm_fake, lib=_scaled_lib)
    _native.register_door("scaled_mm", _resolve_scaled, _scaled_mm_cuda)
else:
    scaled_mm_op = forward_op("scaled_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias, str table, "
                              "ScalarType out_dtype) -> Tensor", _scaled_mm_cuda, _scaled_mm_cpu, _scaled_mm_fake)
"""`matmul` of fp8 operands with their scales (and a bias) as an operator, the table by its
registered key, held to `matmul`'s default min_ratio: defined by the native library where it is
loaded (its C++ CUDA kernel launches the plan `_resolve_scaled` made, or torch._scaled_mm, with
no Python per call), else here with Python kernels. What `Fp8Linear` calls under torch.compile,
where a call of `matmul` itself broke the graph at every Linear (on an H200 a 4-block
Llama-3-8B-shaped fp8 model at 2048 tokens stepped in 7.0-7.3 ms so against 3.1 ms for the same
model on torch._scaled_mm compiled whole: benchmarks/fp8.md, "In the model") and now costs the
`matmul` operator's Python kernel a call."""


matmul_op: Any = forward_op("matmul(Tensor a, Tensor b, str table, ScalarType? out_dtype, Tensor? bias, "
                            "str activation, Tensor? c, float alpha, float? beta, Tensor? scale_a, "
                            "Tensor? scale_b, Tensor? gate, float min_ratio) -> Tensor",
                            _matmul_cuda, _matmul_cpu, _matmul_fake)
"""`cutlass_tune.matmul` as an operator, every argument as the function takes it and the table by
its registered key: what `matmul` runs while torch.compile traces it (`compiled_matmul`), so a
compiled model that calls the function keeps one graph. Its CUDA kernel is `matmul` itself (the
native door where the library is loaded): a Python kernel, some microseconds of host time a call
more than `mm`, `linear` and `scaled_mm`, which a model that runs many small GEMMs should call."""


@torch.compiler.assume_constant_result
def _traced_key(table: str | Path) -> str:
    """`table_key` at trace time: Dynamo calls it once and keeps the key (a path or key, by value),
    with no graph break for the registration."""
    return table_key(table)


@torch.compiler.assume_constant_result
def _traced_object_key(trace_key: str) -> str:
    """A table object's key at trace time: the object bound to its `trace_key` (Dynamo reads the
    attribute as a constant; not every torch takes the object itself as one)."""
    return register_table(traced_table(trace_key), key=trace_key)


@torch.compiler.assume_constant_result
def _traced_held_key(key: str, min_ratio: float) -> str:
    """A key bound to `key`'s table whose `mm` plans are held to `min_ratio` (`_held`), made at
    trace time: `mm` resolves at 0.0 for the layers `patch` swapped, `matmul` at its caller's."""
    held = f"{key}@min_ratio={min_ratio!r}"
    table = registered_table(key)
    with _lock:
        _tables[held] = table
        _held[held] = key, min_ratio
    _native.bind(held, table, min_ratio)
    return held


def compiled_matmul(a: torch.Tensor, b: torch.Tensor, table: BestTable | str | Path, out_dtype: torch.dtype | None,
                    bias: torch.Tensor | None, activation: Activation | str, c: torch.Tensor | None, alpha: float,
                    beta: float | None, scale_a: torch.Tensor | None, scale_b: torch.Tensor | None,
                    gate: torch.Tensor | None, min_ratio: float) -> torch.Tensor:
    """`matmul`'s arguments as an operator (what `matmul` calls under torch.compile): a plain
    16-bit product through `mm` on a key held to `min_ratio`, fp8 with scales at the default
    min_ratio through `scaled_mm` (the same plans `matmul` makes; both native where the library is
    loaded, Inductor's extern kernels), every other call through `matmul_op`, whose kernel is Python."""
    name = activation.value if isinstance(activation, Activation) else activation
    key = _traced_object_key(table.trace_key) if isinstance(table, BestTable) else _traced_key(table)
    product_only = (c is None and gate is None and name == Activation.NONE.value and alpha == 1.0 and beta is None
                    and a.dim() == 2 and b.dim() == 2 and a.dtype == b.dtype)
    if product_only and bias is None and scale_a is None and scale_b is None and a.dtype in _PLAIN_DTYPES \
            and out_dtype in (None, a.dtype):
        return mm(a, b, _traced_held_key(key, float(min_ratio)))
    if product_only and scale_a is not None and scale_b is not None and min_ratio == _MIN_RATIO \
            and a.dtype in FP8_DTYPES:
        return scaled_mm_op(a, b, scale_a, scale_b, bias, key, result_dtype(a.dtype, out_dtype))
    return matmul_op(a, b, key, out_dtype, bias, name, c, float(alpha),
                     None if beta is None else float(beta), scale_a, scale_b, gate, float(min_ratio))


_matmul_module._compiled_door = compiled_matmul
