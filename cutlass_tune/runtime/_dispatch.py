"""The runtime dispatcher: what a call of a tuned GEMM runs, resolved once per call signature.

Every door (`matmul`, `grouped_mm`, the operators `mm`, `linear` and `grouped_mm`, `Linear`,
`patch`'s layers, `Fp8Linear`, the transformers experts) goes through here:

    Call (what identifies a call: kind, the problem its tensors pose, device, min_ratio and
          the tensors' metadata)  --resolve(table, call)-->  Plan

`resolve` is the one place that looks the table up (the rows of the device's GPU model, the
nearest tuned problem), holds the table's ratio against `min_ratio`, and decides the fallback
to torch with its reason. A `Plan` is plain data (the problem, the kernel's config hash, library
and symbol, the launch arguments without addresses, the workspace policy and size, the fallback),
what a C++ operator could hold. `PlanCache` (one per table, `BestTable.plans`) keeps each call
signature's plan with its loaded kernel (`Ready`): the hot path is one dict lookup on a tuple of
the tensors' metadata, then the launch. Loaded kernels are kept per process by (config hash,
library, run-time arguments) (`load_kernel`), with their ready instances and workspaces.

`eager_direct_allowed` decides, for every door, whether eager code may skip the torch operator's
dispatch and call the kernel directly.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch

from .._torch import TORCH_DTYPE
from ..measurement import Baseline
from ..space import Activation, DType, Grouping, KernelConfig, Problem, RuntimeArgs, Scaling
from ..tables import BestTableError, BundledKernel
from ._table import BestTable, Match

if TYPE_CHECKING:
    from ._grouped import GroupedLaunch
    from ._matmul import Gemm

OUT_DTYPES = {TORCH_DTYPE[d]: d for d in (DType.BF16, DType.F16, DType.F32)}
"""The result types the tuned kernels write, by torch dtype."""


# ---------------------------------------------------------------------------------------------
# Shared helpers of the doors


_warned: set[str] = set()


def warn_once(key: str, message: str, category: type[Warning] = RuntimeWarning) -> None:
    """A warning of `category` (a fallback's RuntimeWarning by default) with `message`, once per
    process for `key`."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, category, stacklevel=3)


class FarRowWarning(UserWarning):
    """A grouped call runs the kernel of the table's nearest tuned problem whose routed rows are
    `FAR_ROWS_OCTAVES` or more octaves from its own (the kernel runs, and is right; its speed was
    measured at another size). Not a RuntimeWarning: nothing falls back."""


FAR_ROWS_OCTAVES = 4.0
"""How far (log2 of the routed rows) the nearest tuned grouped problem may be before a call says
so: on an H200, a one-token call of DeepSeek-V2-Lite's experts (6 routed rows) ran the kernel
tuned at 49,152 (13 octaves) 22% slower in the layer than a kernel swept at its size, a 64-token
call (384 rows, 7 octaves) 12% slower; Qwen3-235B's one-token call ran the kernel tuned at 2,048
rows (8 octaves) as fast as its own (benchmarks/moe_decode.md). A hint, once per expert shape."""


@functools.lru_cache(maxsize=8)
def load_table(source: str) -> BestTable:
    """`BestTable.load(source)`, kept per path (8 at most)."""
    return BestTable.load(source)


def current_stream(device: int) -> int:
    """The handle of the current CUDA stream of `device`: torch's raw accessor where the build
    has it (no Stream object per call), else the public one."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


@functools.cache
def sm_count(device: int) -> int:
    """The multiprocessors of CUDA device `device`."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def _device_rows(table: BestTable, device: int) -> tuple[BestTable, str | None]:
    """The rows of `table` that CUDA device `device` may use, kept per device, and where the
    table has rows but none of this GPU model, the sentence saying so (else None)."""
    rows = table._devices.get(device)
    name = None
    if rows is None:
        name = torch.cuda.get_device_name(device)
        rows = table._devices[device] = table.for_gpu(name)
    if not (rows.frame.empty and not table.frame.empty):
        return rows, None
    name = name or torch.cuda.get_device_name(device)
    return rows, (f"the table was tuned on {', '.join(table.gpus)}, not on this GPU (cuda:{device}, {name}): its "
                  "kernels are not used here and torch computes instead (tune on this GPU, or load the table of "
                  "this GPU)")


def device_table(table: BestTable, device: int, caller: str) -> BestTable:
    """The rows of `table` that CUDA device `device` may use: those tuned on its GPU model
    (`BestTable.for_gpu`), kept per device. Where the table has rows but none of this model (an
    H100 table on an H200), a warning names both GPUs once and the caller falls back to torch."""
    rows, other_gpu = _device_rows(table, device)
    if other_gpu is not None:
        warn_once(f"gpu {id(table)} {device}", f"cutlass_tune.{caller}: {other_gpu}")
    return rows


native_operators = False
"""Whether the operators are the native library's with their CUDA kernels in C++ (set by
`_native.load`): then the operator's call costs less host time than the Python direct path, and
no door skips it."""


def eager_direct_allowed(*tensors: torch.Tensor | None, native_op: bool = True) -> bool:
    """Whether eager code may call a kernel without its torch operator (the operator's
    dispatch costs more host time than a small GEMM's kernel takes; never where the operator is
    one the native library defines and it is loaded, `native_operators`: its C++ dispatch is the
    cheaper path; `native_op` False for an operator defined in Python): every tensor given is on
    CUDA, none needs a gradient, nothing is compiled or traced (torch.compile, export), and no
    dispatch mode (fake tensors, `cutlass-tune shapes`) must see the operator. The one decision
    for every door (`Linear`, `patch`'s gated MLP, the transformers experts, the MoE layer's GLU
    stage)."""
    if (native_op and native_operators) or torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:  # a loop, not all(...): a generator costs a microsecond of a call's host path
        if t is not None and not (t.is_cuda and not (grad and t.requires_grad)):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Call, Plan


class Kind(enum.Enum):
    """What kind of launch a call is: one GEMM, or a ptr-array grouped GEMM (MoE experts)."""

    DENSE = "dense"
    GROUPED = "grouped"


class Workspace(enum.Enum):
    """Where a launch's workspace comes from."""

    NONE = "none"
    """The kernel needs none."""
    KEPT = "kept"
    """One kept per thread and device (dense) or device and stream (grouped), reused by every
    launch; a launch under CUDA graph capture, or on the stream of torch.compile's CUDA graph
    trees, takes one per call instead."""
    PER_CALL = "per_call"
    """One from torch's caching allocator per launch: Stream-K (its barriers start at zero every
    launch, and each launch a CUDA graph captures needs its own), or a grouped call asked so."""


class FallbackReason(enum.Enum):
    """Why torch computes a call instead of a tuned kernel."""

    NO_ROW = "no_row"
    """The table has no row of this operation (for a grouped one: of these experts)."""
    BELOW_MIN_RATIO = "below_min_ratio"
    """The table measured its kernel at less than `min_ratio` of torch's time."""
    CANNOT_IMPLEMENT = "cannot_implement"
    """CUTLASS refused the problem when the kernel was initialized for it."""
    WRONG_GPU = "wrong_gpu"
    """The table was tuned on other GPU models only."""
    INPUT_NOT_TAKEN = "input_not_taken"
    """The tensors are ones no tuned kernel takes (dtype, layout, alignment)."""
    EMPTY = "empty"
    """Nothing to compute (a grouped call of no routed rows): an empty result."""


@dataclasses.dataclass(frozen=True)
class Fallback:
    """What torch runs for a call instead of a kernel, and why."""

    path: str
    """torch's path, in words ("torch.matmul", "F.linear and torch's silu", "torch's grouped GEMM")."""
    reason: FallbackReason
    detail: str
    """The sentence said once as a RuntimeWarning."""
    ratio: float = math.nan
    """The table's ratio of its kernel to torch (BELOW_MIN_RATIO)."""
    fast_accum: bool = False
    """torch's fp8 GEMM runs with fast accumulation (the path an fp8 kernel with fast
    accumulation was measured against)."""


@dataclasses.dataclass(frozen=True)
class KernelRef:
    """A tuned kernel as its library exports it: the entry points `<symbol>_<name>` of the C ABI
    (`cutlass_tune.kernel._abi.ENTRY_POINTS`) in `library`, run with `runtime`."""

    config_hash: str
    name: str
    library: str
    symbol: str
    runtime: RuntimeArgs


@dataclasses.dataclass(frozen=True)
class Call:
    """What identifies a call signature: its kind, the problem its tensors pose (operation:
    dtypes, layouts, epilogue, scaling, grouping; shapes; the result's type), the device, the
    caller's `min_ratio` and the tensors' metadata (`signature`, the plan cache's key: shapes,
    strides and dtypes of every operand, the arguments that change the plan)."""

    kind: Kind
    problem: Problem
    device: int
    min_ratio: float
    signature: tuple
    keep_workspace: bool = True
    """Grouped calls: a workspace kept per thread, device and stream (else one per call)."""

    @property
    def door(self) -> str:
        if self.kind is not Kind.GROUPED:
            return "matmul"
        return "grouped_weight_grad" if self.problem.grouping is Grouping.GROUPED_K else "grouped_mm"


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a call signature runs, resolved once: plain data (no tensors, no addresses).

    `kernel` None means torch computes (`fallback` says which path and why). Otherwise `args`
    is the kernel's `GemmArgs` (the C ABI's `struct cutlass_tune_args`) with every address zero
    and alpha 1: a launch fills in the operands', the result's, the offsets' addresses and its
    alpha and beta. `workspace_bytes` is what `<symbol>_workspace_size` answered for them.
    """

    problem: Problem
    device: int
    kernel: KernelRef | None = None
    args: bytes = b""
    workspace: Workspace = Workspace.NONE
    workspace_bytes: int = 0
    fallback: Fallback | None = None
    exact: bool = False
    """The table's row is the problem asked for (else the nearest tuned one)."""
    ratio: float = math.nan
    """The table's ratio of the kernel's row to torch (NaN: none)."""


class Ready(NamedTuple):
    """A plan with what runs it in this process: its loaded kernel (None: torch) and, for a
    grouped kernel, its `GroupedLaunch`."""

    plan: Plan
    gemm: Gemm | None = None
    launch: GroupedLaunch | None = None


# ---------------------------------------------------------------------------------------------
# resolve


def untuned_path(problem: Problem) -> str:
    """torch's path for `problem`, in words."""
    if problem.grouped:
        return "torch's grouped GEMM"
    gemm = "torch._scaled_mm" if problem.dtype_a.is_fp8 else "torch.matmul"
    if problem.epilogue.is_plain:
        return gemm
    if problem.epilogue.bias and not problem.dtype_a.is_fp8 and not problem.epilogue.residual:
        gemm = "F.linear"
    act = problem.epilogue.activation
    if problem.epilogue.gated:
        return f"{gemm} times the gate" if act is Activation.NONE else f"{gemm} times torch's {act.value} of the gate"
    return gemm if act is Activation.NONE else f"{gemm} and torch's {act.value}"


def ratio_to_torch(match: Match, problem: Problem) -> float:
    """The row's ratio to the path torch runs for `problem` in its place: cuBLASLt's epilogue
    for a bias with ReLU or tanh GELU (the row's `cublaslt_ratio`, where it has one), else the
    row's baseline (`ratio`)."""
    if Baseline.CUBLASLT.applies(problem):
        lt = float(match.row.get("cublaslt_ratio", math.nan))
        if not math.isnan(lt):
            return lt
    return match.ratio


def _fallback(call: Call, reason: FallbackReason, detail: str, key: str, *, ratio: float = math.nan,
              fast_accum: bool = False) -> Plan:
    path = untuned_path(call.problem) + (" with fast accumulation" if fast_accum else "")
    if reason is not FallbackReason.EMPTY:
        warn_once(key, f"cutlass_tune.{call.door}: {detail}; using {path}")
    return Plan(call.problem, call.device, fallback=Fallback(path, reason, detail, ratio, fast_accum), ratio=ratio)


def _far_rows(call: Call, tuned_rows: int, octaves: float) -> None:
    """Say once per expert shape that a grouped call runs a kernel tuned `octaves` away from its
    routed rows, with the sweep that tunes its own size (its operation's options where they are
    not `--shapes`'s defaults)."""
    p = call.problem
    shape = f"{'dw' if p.grouping is Grouping.GROUPED_K else 'e'}{p.groups}:{p.m}x{p.n}x{p.k}"
    options = [f"--shapes {shape}"]
    if p.dtype_a is not DType.BF16 or p.dtype_d is not p.dtype_a:
        options.append(f"--dtype {p.dtype_a.value}" + (f":{p.dtype_d.value}" if p.dtype_d is not p.dtype_a else ""))
    if p.layout != "tn" and p.grouping is not Grouping.GROUPED_K:
        options.append(f"--layout {p.layout}")
    if not p.epilogue.is_plain:
        options.append(f"--epilogue {p.epilogue.name}")
    warn_once(f"far {p.operation.name} e{p.groups} {p.n}x{p.k}",
              f"cutlass_tune.{call.door}: {p.m} routed rows of {p.groups} experts of {p.n}x{p.k} run the kernel "
              f"the table tuned at {tuned_rows} rows, its nearest ({octaves:.0f} octaves away): a kernel tuned far "
              f"from a call's size can be slower there; `cutlass-tune sweep {' '.join(options)}` tunes this one",
              FarRowWarning)


def resolve(table: BestTable, call: Call) -> Plan:
    """The plan of `call` on `table`: the table's kernel for the problem (the row of this GPU
    model for exactly that problem, else the nearest tuned problem of the same operation; for a
    grouped one, the same experts and the nearest routed rows), loaded (`load_kernel`: compiled
    on first use where no bundle holds it), or torch's path and why (no row, another GPU's
    table, a row below `call.min_ratio`, no rows to compute). A fallback is said once per cause
    as a RuntimeWarning.

    Raises:
        CutlassTuneError: the table's kernel does not compile; KernelLoadError: its library
            cannot be loaded.
    """
    problem = call.problem
    if problem.m == 0:
        return _fallback(call, FallbackReason.EMPTY, "no rows", "")
    rows, other_gpu = _device_rows(table, call.device)
    if other_gpu is not None:
        return _fallback(call, FallbackReason.WRONG_GPU, other_gpu, f"gpu {id(table)} {call.device}")
    try:
        match = rows.find(problem.m, problem.n, problem.k, problem.operation, groups=problem.groups)
    except BestTableError as err:
        asked = f"{problem.operation} e{problem.groups} {problem.n}x{problem.k}" if problem.grouped else \
            f"{problem.dtype_a.value} -> {problem.dtype_d.value} {problem.layout} {problem.words}"
        return _fallback(call, FallbackReason.NO_ROW, str(err), asked)
    # the in-model figure, else the call site's, else the claim (Match.dispatch_ratio)
    ratio, source = match.dispatch_ratio(ratio_to_torch(match, problem))
    name = str(match.row.get("kernel") or match.config.name)
    if call.min_ratio > 0 and not ratio >= call.min_ratio:
        fast_accum = (not problem.grouped and problem.scaling is not Scaling.BLOCKWISE
                      and match.config.fp8_fast_accum)
        torch_words = "torch's grouped GEMM" if problem.grouped else "torch"
        measured = (f"was measured against {torch_words}{source}" if source else f"has no ratio to {torch_words}") \
            if math.isnan(ratio) else f"was measured at {ratio:.3f}x {torch_words}{source}"
        where = problem.name if match.exact else f"{problem.name} (its nearest tuned problem)"
        return _fallback(call, FallbackReason.BELOW_MIN_RATIO,
                         f"the table's {name} for {where} {measured}, below min_ratio {call.min_ratio}",
                         f"ratio {name} {problem.name} {call.min_ratio}", ratio=ratio, fast_accum=fast_accum)
    if problem.grouped and match.distance >= FAR_ROWS_OCTAVES:
        _far_rows(call, int(match.row["m"]), match.distance)
    bundled = table.bundled.get(match.row["config_hash"]) if table.bundled else None
    gemm = load_kernel(call.kind, match.row["config"], match.runtime, bundled)
    args, size = gemm.template(problem, call.device)
    kernel = KernelRef(gemm.config.hash, name, str(gemm.kernel.library), gemm.kernel.symbol,
                       match.runtime)
    return Plan(problem, call.device, kernel, bytes(args), gemm.workspace_policy(size, call.keep_workspace), size,
                exact=match.exact, ratio=ratio)


def input_not_taken(door: str, err: Exception, path: str) -> Fallback:
    """The fallback of a call whose tensors no tuned kernel takes (`err`, a MatmulInputError
    from the checks that pose its problem): torch's `path`, said once per cause."""
    warn_once(str(err), f"cutlass_tune.{door}: {err}; using {path}")
    return Fallback(path, FallbackReason.INPUT_NOT_TAKEN, str(err))


def cannot_implement(table: BestTable, call: Call, ready: Ready, err: Exception) -> Ready:
    """The plan of `call` once CUTLASS refused its kernel (`err`): torch's path, said once, kept."""
    kernel = ready.plan.kernel
    name = kernel.name if kernel is not None else "the kernel"
    plan = _fallback(call, FallbackReason.CANNOT_IMPLEMENT, f"{name} cannot run {call.problem.name} ({err})",
                     f"{call.door} {name}")
    return table.plans.put(call.signature, Ready(plan))


def prepare(table: BestTable, call: Call) -> Ready:
    """`resolve(table, call)` with its loaded kernel, kept in the table's plan cache."""
    plan = resolve(table, call)
    if plan.kernel is None:
        return table.plans.put(call.signature, Ready(plan))
    gemm = loaded(call.kind, plan.kernel)
    return table.plans.put(call.signature, Ready(plan, gemm, gemm.launch_of(plan)))


# ---------------------------------------------------------------------------------------------
# The process's loaded kernels


_loaded: dict[tuple[Kind, str, str, RuntimeArgs], Gemm] = {}
_load_lock = threading.Lock()


def load_kernel(kind: Kind, config_json: str, runtime: RuntimeArgs, bundled: BundledKernel | None) -> Gemm:
    """The loaded kernel of a table row (a `Gemm`, or a `GroupedGemm` for `Kind.GROUPED`): its
    bundle's library, else compiled on first use into the kernel cache. One per process for
    each (config hash, library, run-time arguments): its ready instances and workspaces are
    shared by every table and call that runs it.

    Raises:
        CutlassTuneError: the kernel does not compile; KernelLoadError: it cannot be loaded.
    """
    return _load(kind, config_json, runtime, bundled)


KERNEL_CLASSES: dict[Kind, type[Gemm]] = {}
"""The class that loads and launches a kernel of each kind, registered by the module that defines
it (`_matmul.Gemm`, `_grouped.GroupedGemm`): the dispatcher names no door's module."""


@functools.cache
def _load(kind: Kind, config_json: str, runtime: RuntimeArgs, bundled: BundledKernel | None) -> Gemm:
    config = KernelConfig.from_dict(json.loads(config_json))
    gemm = KERNEL_CLASSES[kind](config, runtime, bundled=bundled)
    with _load_lock:
        return _loaded.setdefault((kind, config.hash, str(gemm.kernel.library), runtime), gemm)


def loaded(kind: Kind, kernel: KernelRef) -> Gemm:
    """The loaded kernel a plan names (`load_kernel` loaded it when the plan was resolved)."""
    return _loaded[(kind, kernel.config_hash, kernel.library, kernel.runtime)]


def clear_loaded() -> None:
    """Forget the loaded kernels (tests): later plans load theirs again."""
    with _load_lock:
        _loaded.clear()
    _load.cache_clear()


def table_of(source: BestTable | str | Path) -> BestTable:
    """A `BestTable` as itself, or what `BestTable.load` reads from a path (kept per path)."""
    return source if isinstance(source, BestTable) else load_table(str(source))
