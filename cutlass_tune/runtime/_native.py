"""The operators' native library: `torch.ops.cutlass_tune.mm`, `.linear`, `.grouped_mm` and
`.scaled_mm` defined in C++ (`cutlass_tune/native/ops.cpp`) with no Python per call on the hot path.

Where the extension is built for this torch (`cutlass-tune native --build`, or `export`, which
carries it in the bundle) `load()` imports it when the operators' modules (`_op`, `_grouped_op`)
are imported: it defines the operators with today's schemas, registers their CUDA and Autograd
kernels in C++, and the modules attach only their fake functions, CPU kernels and Python
autograd formulas (`register`). Where it is not built, disabled (`CUTLASS_TUNE_NATIVE=0`) or
cannot be loaded, the modules define the operators in Python as before; a build or load that
failed says why once as a RuntimeWarning. Nothing is built on import.

What C++ asks of Python (`attach`), each once per call signature or rarer:
- `resolve(op, *args)`: the plan of a signature the C++ map has not seen, as plain data
  (`plan_entry`): a kernel's entry points, argument template and workspace policy, or which
  path computes it instead.
- `door(op, *args)`: the Python CUDA kernel of today, for signatures C++ does not launch itself
  (tensors no kernel takes, fallbacks other than torch's plain operator).
- `autograd(op, *args)`: the Python autograd formula, only for a `linear` activation C++ does
  not know (the C++ autograd Functions compute every other gradient).
- `refused(op, table, name, code)`, `may_keep(device, stream)`: a kernel CUTLASS refused at
  initialize; whether a workspace allocated on `stream` may be kept past the call.

The function doors `cutlass_tune.matmul` and `cutlass_tune.grouped_mm` go through the library
too where it launches on CUDA (`door`): their calls without an epilogue (and, for the grouped
one, without scales) are `door.matmul(...)` and `door.grouped_mm(...)` on a key of their table
(`door_key`), resolved in Python once per signature (`register_door`) as the operators are.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import itertools
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from .. import settings
from ..tables import PROFILER_RANGE
from . import _dispatch
from ._dispatch import Ready, Workspace, warn_once

NATIVE_SCHEMAS = ("mm", "linear", "grouped_mm", "scaled_mm")
"""The operators the library defines (native/ops.cpp; the MoE glue's are moe.cu's)."""
ENTRY_PYTHON, ENTRY_TORCH, ENTRY_EMPTY, ENTRY_KERNEL = 0, 1, 2, 3
"""What a C++ plan entry runs (ops.cpp's EntryKind)."""
_WORKSPACE = {Workspace.NONE: 0, Workspace.KEPT: 1, Workspace.PER_CALL: 2}
_ENTRY_POINTS = ("create", "destroy", "initialize", "run")


@dataclasses.dataclass(frozen=True)
class Operator:
    """What an operator's Python module hands the native library (`register`)."""

    resolve: Callable[..., tuple]
    """The plan entry of a call signature (`plan_entry`)."""
    door: Callable[..., torch.Tensor]
    """The Python CUDA kernel (today's)."""
    function: type[torch.autograd.Function] | None = None
    """The autograd formula, applied to the operator's arguments (a function door has none)."""


_operators: dict[str, Operator] = {}
_lock = threading.Lock()
_module: ModuleType | None = None
door: ModuleType | None = None
"""The loaded library where it launches CUDA kernels (the function doors' native path), else None."""
_door_tables: dict[str, weakref.ref] = {}
_door_keys = itertools.count(1)
_OPERATORS = "/operators"
"""The suffix of a table's operator plan set after its door key (`operator_plans`)."""
_held_sets: dict[str, set[str]] = {}
"""A door key's operator plan sets held to a min_ratio (`operator_plans`), forgotten with its own."""
_tried = False
_why: str | None = None
_bundles: list[Path] = []


def enabled() -> bool:
    """Whether the native library may be used (`CUTLASS_TUNE_NATIVE` is not 0)."""
    return settings.native_enabled()


def load(bundle: str | Path | None = None) -> ModuleType | None:
    """The native module, imported on the first call where a built copy for this torch exists
    in the kernel cache or in a bundle given before (`bundle`: a bundle directory, remembered
    for a load still to come); None where there is none, it is disabled, or it cannot be
    loaded (said once as a RuntimeWarning, but for a copy never built). Never builds.

    Thread-safe. A bundle given after the operators were defined in Python is used by the next
    process only: an operator is defined once.
    """
    global _module, _tried, _why, door
    with _lock:
        if bundle is not None:
            _bundles.append(Path(bundle))
        if _tried:
            return _module
        _tried = True
        if not enabled():
            _why = "disabled by CUTLASS_TUNE_NATIVE=0"
            return None
        try:
            _module = _import()
            _dispatch.native_operators = bool(_module is not None and _module.cuda)
            door = _module if _dispatch.native_operators else None
        except Exception as err:  # any failure to find or load it leaves the Python path
            _why = f"the native operators cannot be loaded ({type(err).__name__}: {err})"
        if _module is None and _why is not None and not _why.startswith("not built"):
            warn_once("native", f"cutlass_tune: {_why}; the operators run their Python path")
        return _module


def _import() -> ModuleType | None:
    global _why
    from ..kernel._elf import library_problem
    from ..kernel._native import LIBRARY, MODULE, cached_builds, find_native, native_key
    from ._table import NATIVE_BUNDLES

    key = native_key()
    outcomes = [find_native(key, folder)
                for folder in (cached_builds(), *(b / "native" for b in (*_bundles, *NATIVE_BUNDLES)))]
    found = next((o for o in outcomes if o is not None and o.library is not None), None)
    if found is None or found.library is None:
        failed = next((o for o in outcomes if o is not None), None)
        _why = failed.reason if failed is not None else "not built for this torch (cutlass-tune native --build)"
        return None
    defined = [op for op in NATIVE_SCHEMAS if _defined(f"cutlass_tune::{op}")]
    if defined:  # loading it would define them again, which aborts the process
        _why = f"the operators ({', '.join(defined)}) were defined in Python before the native library could load"
        return None
    problem = library_problem(found.library, (f"PyInit_{MODULE}",))
    if problem:
        _why = f"{found.library} is refused: {problem}"
        return None
    spec = importlib.util.spec_from_file_location(MODULE, found.library)
    assert spec is not None and spec.loader is not None, f"{LIBRARY} is an extension module"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.attach(_resolve, _door, _autograd, _refused, _may_keep)
    module.path = found.library  # type: ignore[attr-defined]
    return module


def _defined(qualname: str) -> bool:
    try:
        torch._C._get_schema(qualname, "")
    except RuntimeError:
        return False
    return True


def reason() -> str | None:
    """Why the native library is not loaded (None where it is, or where no load was tried)."""
    return _why


def available() -> bool:
    """Whether the operators are the native library's in this process."""
    return _module is not None


def cuda() -> bool:
    """Whether the loaded library launches the CUDA kernels in C++ (built against a CUDA torch)."""
    return bool(_module is not None and _module.cuda)


def forget(table: str | None = None) -> None:
    """Drop the native plans of a table key or plan set (all of them: None)."""
    if _module is not None:
        _module.forget(table)


def bind(key: str, table: Any, min_ratio: float = 0.0) -> None:
    """Bind an operator's table key to `table`'s own plan set (`register_table`): calls on the key
    find that table's plans, kept while the table lives and its plans are not cleared, so a key
    bound to one table, then another, then the first again (tune-model's A/B between steps)
    resolves no signature twice. A key whose plans are held to a min_ratio (`_op._held`) has a
    plan set of its own: the same signature may resolve to a kernel at 0.0 and to torch at 1.0."""
    if _module is not None:
        _module.bind(key, operator_plans(table, min_ratio))


def operator_plans(table: Any, min_ratio: float = 0.0) -> str:
    """The plan set of the operators' calls on `table` (beside its function doors' set, `door_key`:
    the same signature may be planned differently by an operator and a door), one per min_ratio
    the plans are held to (0.0: `patch`'s layers)."""
    door = door_key(table)
    plans = door + _OPERATORS
    if min_ratio:
        plans = f"{plans}@min_ratio={min_ratio!r}"
        with _lock:
            _held_sets.setdefault(door, set()).add(plans)
    return plans


def build(retry: bool = True) -> Any:
    """Build the native library for this torch into the kernel cache (a compiler is needed):
    `cutlass_tune.compile._native.build_native`'s `NativeBuild`."""
    from ..compile._native import build_native

    return build_native(retry=retry)


# ---------------------------------------------------------------------------------------------
# What the operators' modules register, and what C++ calls


def register(op: str, resolve: Callable[..., tuple], door: Callable[..., torch.Tensor],
             backward: Callable[..., Any], setup_context: Callable[..., None]) -> None:
    """Attach the Python parts of the native operator `op` (its schema defined in C++): the
    resolver, the door, and the autograd formula (`backward`, `setup_context` as
    `torch.library.register_autograd` takes them)."""
    overload = getattr(torch.ops.cutlass_tune, op).default

    def forward(ctx: Any, *args: Any) -> torch.Tensor:
        with torch._C._AutoDispatchBelowAutograd():
            out = overload(*args)
        setup_context(ctx, args, out)
        return out

    # Named for the operator: its backward node shows as cutlass_tune_<op>Backward.
    function = type(f"cutlass_tune_{op}", (torch.autograd.Function,),
                    {"forward": staticmethod(forward), "backward": staticmethod(backward)})
    _operators[op] = Operator(resolve, door, function)


def register_door(op: str, resolve: Callable[..., tuple], door_: Callable[..., torch.Tensor]) -> None:
    """Attach a function door's Python parts: the resolver of a signature (given the door's
    table key, `door_table` finds the table) and the Python door for the calls C++ hands back."""
    _operators[op] = Operator(resolve, door_)


def door_key(table: Any) -> str:
    """The key of `table`'s plans in the library's map for the function doors: one per table
    object, its plans forgotten with the table's own (`PlanCache.clear`) and when it is collected."""
    key = table.plans.native_key
    if key is None:
        with _lock:
            key = table.plans.native_key
            if key is None:
                key = f"door-{next(_door_keys)}"  # no operator key (register_table's) looks like it
                _door_tables[key] = weakref.ref(table)
                table.plans.on_clear = _forgetter(key)
                weakref.finalize(table, _forget_door, key)
                table.plans.native_key = key
    return key


def _forgetter(key: str) -> Callable[[], None]:
    def forget_both() -> None:
        forget(key)
        forget(key + _OPERATORS)
        for held in sorted(_held_sets.get(key, ())):
            forget(held)

    return forget_both


def _forget_door(key: str) -> None:
    _door_tables.pop(key, None)
    _forgetter(key)()
    _held_sets.pop(key, None)


def door_table(key: str) -> Any:
    """The table of a door key (`door_key`)."""
    table = _door_tables[key]()
    assert table is not None, f"the table of {key} was collected with plans left"
    return table


def plan_entry(ready: Ready, torch_path: bool) -> tuple:
    """A plan as C++ holds it: (kind, kernel name, entry point addresses, argument template,
    workspace policy, workspace bytes, initialize before every launch, profiler range). A fallback
    is torch's plain operator where `torch_path` (C++ calls it, in the same range; for fp8 operands
    with their scales torch._scaled_mm, with fast accumulation where the fallback says so), else
    the Python door (which opens its own). The range (`PROFILER_RANGE` and the problem's name) is what a
    profile attributes the call's kernels by, as the Python doors' ranges (tune-model reads them)."""
    plan = ready.plan
    if plan.kernel is None or ready.gemm is None:
        if plan.problem.m == 0 and plan.problem.grouped:
            return (ENTRY_EMPTY,)
        if not torch_path:
            return (ENTRY_PYTHON,)
        fast_accum = plan.fallback is not None and plan.fallback.fast_accum
        return (ENTRY_TORCH, PROFILER_RANGE + plan.problem.name, fast_accum)
    functions = ready.gemm.kernel._fn
    addresses = tuple(ctypes.cast(functions[name], ctypes.c_void_p).value for name in _ENTRY_POINTS)
    # A dense kernel with a workspace (Stream-K) is initialized before every launch on a
    # workspace of its own (as `Gemm.run` does for Stream-K).
    every = ready.launch is None and plan.workspace_bytes > 0
    workspace = _WORKSPACE[Workspace.PER_CALL] if every else _WORKSPACE[plan.workspace]
    return (ENTRY_KERNEL, plan.kernel.name, addresses, plan.args, workspace, plan.workspace_bytes, every,
            PROFILER_RANGE + plan.problem.name)


def _resolve(op: str, *args: Any) -> tuple:
    return _operators[op].resolve(*args)


def _door(op: str, *args: Any) -> torch.Tensor:
    return _operators[op].door(*args)


def _autograd(op: str, *args: Any) -> torch.Tensor:
    function = _operators[op].function
    assert function is not None, f"{op} is a function door: it has no autograd formula"
    return function.apply(*args)


def _refused(op: str, table: str, name: str, code: int) -> None:
    # The door runs the call next and meets the refusal itself: it says it once and keeps torch's path.
    pass


def _may_keep(device: int, stream: int) -> bool:
    from ._grouped import _may_keep as may_keep

    return may_keep(device, stream)
