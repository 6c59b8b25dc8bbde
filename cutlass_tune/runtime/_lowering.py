"""Inductor calls the operators as extern kernels that write into its own buffer.

Without this module a compiled graph calls `torch.ops.cutlass_tune.scaled_mm.default(...)` (or
`mm`, `linear`, `grouped_mm`, the MoE layer's `moe_gather`, `moe_gate_up_glu`, `moe_combine`)
through the dispatcher, then checks the result's sizes, strides and alignment: on an H200 host a
compiled fp8 model's step spent about 13 us more per GEMM than torch's own graph, which calls
`extern_kernels._scaled_mm(..., out=buf)` (benchmarks/host_path.md, "Extern kernels"). Here each
operator gets an Inductor lowering that emits

    cutlass_tune_extern.scaled_mm_into(a, b, scale_a, scale_b, None, 'table-key', torch.bfloat16, buf)

where `cutlass_tune_extern` is this module and `scaled_mm_into` the native library's
`scaled_mm_out` (native/ops.cpp; an operator defined in Python names its own kernel,
`register_kernel`: the GLU stage's calls the library's `grouped_glu_out`): the same plans and
kernels as the operator's CUDA kernel, its result written into the buffer Inductor allocated (no
dispatcher, no autograd layer, no output checks). The buffer is the last positional argument, not
Inductor's usual `out=`: pybind's keyword matching costs 1-1.5 us a call on a 2-core CPU host,
against 0.5 for the positional call.

When it applies: the operator's result is on CUDA and the native library is loaded, or on the CPU
(the operator's CPU kernel through the dispatcher, copied into the buffer: one code path for the
CPU tests to exercise). Otherwise (CUDA without the native library, Inductor's C++ wrapper or
AOTInductor) the lowering hands the call to Inductor's fallback, which calls the operator as
before. `CUTLASS_TUNE_EXTERN=0` turns the lowerings off; a graph Inductor cached with extern
kernels (its cache key does not see this setting) then calls the operators through the dispatcher
from those kernels (`CALL`).

When it is registered: importing `torch._inductor.lowering` costs seconds, so nothing here imports
it. The operators' fake kernels call `ensure(name)`, which registers the operator's lowering once
the lowering module is loaded (an operator defined later, by a module imported later, is
registered by its own fake); a compile traces the graph with fake tensors inside Inductor's entry
(AOTAutograd) before it lowers, so the first compile of a process gets them. The generated code
imports this module itself, so a graph loaded from Inductor's cache finds its kernels.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .. import settings
from . import _native
from ._dispatch import warn_once

OPERATORS = ("mm", "linear", "grouped_mm", "scaled_mm", "moe_gather", "moe_combine", "moe_gate_up_glu")
"""The operators lowered to extern kernels where they are defined in the process: their native
library's `<name>_out`, or the kernel `register_kernel` names (the MoE glue's `moe_gather` and
`moe_combine` exist in a CUDA build of the library only; `moe_gate_up_glu` once runtime/_moe_glu.py
is imported)."""
IMPORT = "from cutlass_tune.runtime import _lowering as cutlass_tune_extern"
"""The line Inductor's generated code imports this module by."""
CALL = "_into"
"""The suffix of the extern kernels' names (`mm_into`, `scaled_mm_into`): their calling convention,
the buffer last and positional. Inductor's graph cache does not see this module, so a graph it
cached with kernels of another convention (another version of the package) names other kernels,
which run the operator through the dispatcher (`_through_op`) and stay correct."""
_CPU = "_cpu"
"""The suffix of an operator's CPU extern kernel (`mm_into_cpu`, ...)."""

_registered: set[str] = set()
_enabled: list[bool] = []
"""settings.extern_enabled() as read at the first registration (empty before it)."""
_kernels: dict[str, Callable[[], Callable[..., None] | None]] = {}
"""An operator's CUDA extern kernel where the native library has no `<name>_out` for it: a function
giving the kernel, or None where the call should keep the dispatcher (`register_kernel`)."""
_suspended = False
_lowered: dict[str, int] = {}
"""How many calls of each operator a lowering made extern kernels of (tests and benchmarks read it)."""


def ensure(*names: str) -> None:
    """Register the lowerings of `names` (default: every operator of `OPERATORS` defined in the
    process) where Inductor's lowering module is loaded and they are not yet registered (cheap
    otherwise: what the operators' fake kernels call on every trace)."""
    names = names or OPERATORS
    if "torch._inductor.lowering" not in sys.modules or _registered.issuperset(names):
        return
    if not _enabled:
        _enabled.append(settings.extern_enabled())
    if not _enabled[0]:
        _registered.update(names)
        return
    try:
        _register(names)
    except Exception as err:  # another torch's Inductor: the operators keep the dispatcher path
        _registered.update(names)
        warn_once("lowering", f"cutlass_tune: the operators' Inductor lowerings cannot be registered "
                              f"({type(err).__name__}: {err}); torch.compile calls them through the dispatcher")


def register_kernel(name: str, kernel: Callable[[], Callable[..., None] | None]) -> None:
    """Name the CUDA extern kernel of operator `name` (one of `OPERATORS` the native library has no
    `<name>_out` for): `kernel()` gives a function of the operator's arguments and the buffer
    last, or None where calls should keep the dispatcher (asked per compiled call)."""
    assert name in OPERATORS, name
    _kernels[name] = kernel


@contextlib.contextmanager
def through_dispatcher() -> Iterator[None]:
    """Graphs compiled inside (their first calls, where torch.compile compiles) call the
    operators through the dispatcher, as without this module: a benchmark's other side. Inductor's
    graph caches are off inside, so neither side is served the other's graph."""
    global _suspended
    import torch._functorch.config
    import torch._inductor.config

    _suspended = True
    try:
        with torch._inductor.config.patch(fx_graph_cache=False), \
                torch._functorch.config.patch(enable_autograd_cache=False):
            yield
    finally:
        _suspended = False


def lowered() -> dict[str, int]:
    """Calls lowered to extern kernels so far in this process, per operator."""
    return dict(_lowered)


def _native_out(name: str) -> Callable[..., None] | None:
    if name in _kernels:
        return _kernels[name]()
    door = _native.door
    return getattr(door, f"{name}_out", None) if door is not None else None


def _through_op(name: str) -> Callable[..., None]:
    """The operator through the dispatcher, its result copied into `out` (the CPU's kernel)."""
    op = getattr(torch.ops.cutlass_tune, name).default

    def run(*args: Any, out: torch.Tensor | None = None) -> None:
        if out is None:  # this module's convention: the buffer last, positional
            *operands, out = args
        else:  # a cached graph's `out=`
            operands = list(args)
        out.copy_(op(*operands).reshape(out.shape))

    run.__name__ = f"{name}{CALL}{_CPU}"
    return run


def __getattr__(attr: str) -> Callable[..., None]:
    """The extern kernels the generated code calls (`cutlass_tune_extern.mm_into(...)`), looked up
    on first use and kept as module attributes: the native library's out variant for a current
    name, else the operator through the dispatcher (a CPU kernel, no native library, an old
    name, CUTLASS_TUNE_EXTERN=0)."""
    name = attr.removesuffix(_CPU).removesuffix(CALL)
    if name not in OPERATORS:
        raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
    kernel = _native_out(name) if attr == name + CALL and settings.extern_enabled() else None
    if kernel is None:
        kernel = _through_op(name)
    globals()[attr] = kernel
    return kernel


def _is_tensor(kind: Any) -> bool:
    if isinstance(kind, torch.OptionalType):
        kind = kind.getElementType()
    return isinstance(kind, torch.TensorType)


def _register(names: tuple[str, ...]) -> None:
    from torch._inductor.lowering import lowerings, register_lowering

    for name in names:
        if name in _registered or not hasattr(torch.ops.cutlass_tune, name):  # not defined (yet)
            continue
        _registered.add(name)
        op = getattr(torch.ops.cutlass_tune, name).default
        if op not in lowerings:
            register_lowering(op, type_promotion_kind=None)(_lowering(name, op))


def _lowering(name: str, op: Any) -> Callable[..., Any]:
    from torch._inductor import ir
    from torch._inductor.lowering import fallback_handler
    from torch._inductor.utils import convert_shape_to_inductor
    from torch._inductor.virtualized import V

    arguments = [(a.name, _is_tensor(a.type), a.default_value if a.has_default_value() else None)
                 for a in op._schema.arguments]

    class NativeOut(ir.ExternKernelOut):
        """The operator's extern kernel: its arguments in the schema's order, tensors from
        `inputs` and the rest constants (`slots`), then Inductor's buffer for the result."""

        slots: tuple[tuple[bool, Any], ...] = ()

        def codegen_args(self) -> list[str]:
            wrapper = V.graph.wrapper_code
            inputs = iter(self.inputs)
            return [wrapper.val_to_arg_str(next(inputs) if is_input else value) for is_input, value in self.slots]

        def codegen(self, wrapper: Any) -> None:
            wrapper.add_import_once(IMPORT)
            comment = getattr(self, "codegen_comment", None)
            if comment is not None:
                comment(wrapper)
            args = [*self.codegen_args(), self.codegen_reference()]  # the buffer last, positional
            wrapper.writeline(f"{self.get_kernel_name()}({', '.join(args)})")

    fallback = fallback_handler(op, add_to_fallback_set=False)

    def lower(*args: Any, **kwargs: Any) -> Any:
        values = list(args) + [kwargs.get(arg, default) for arg, _, default in arguments[len(args):]]
        val = V.graph.current_node.meta.get("val") if V.graph.current_node is not None else None
        kernel = _kernel_name(name, val, V.graph.cpp_wrapper)
        odd = any(is_tensor and value is not None and not isinstance(value, ir.IRNode)
                  for (_, is_tensor, _), value in zip(arguments, values))
        if kernel is None or odd or not isinstance(val, torch.Tensor):
            return fallback(*args, **kwargs)
        slots = tuple((isinstance(v, ir.IRNode), v) for v in values)
        inputs = [ir.ExternKernel.realize_input(v) for is_input, v in slots if is_input]
        layout = ir.FixedLayout(val.device, val.dtype, convert_shape_to_inductor(val.size()))
        node = NativeOut(layout=layout, inputs=inputs, python_kernel_name=f"cutlass_tune_extern.{kernel}")
        node.slots = tuple((is_input, None if is_input else v) for is_input, v in slots)
        _lowered[name] = _lowered.get(name, 0) + 1
        return ir.TensorBox.create(node)

    return lower


def _kernel_name(name: str, val: Any, cpp_wrapper: bool) -> str | None:
    """The extern kernel of a call whose result is `val` (a fake tensor), or None where the
    operator is better called as before."""
    if _suspended or cpp_wrapper or not isinstance(val, torch.Tensor):
        return None
    if val.device.type == "cuda" and _native_out(name) is not None:
        return name + CALL
    if val.device.type == "cpu":
        return name + CALL + _CPU
    return None
