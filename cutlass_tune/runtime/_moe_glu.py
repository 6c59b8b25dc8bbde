"""The gate_up weights of a grouped GLU kernel (`space.Pair.INTERLEAVED`), laid out once.

transformers stores an experts layer's gate_up_proj SPLIT: E x 2I x H, the gate's I rows, then
the up's I rows. A grouped GEMM whose epilogue computes act(gate) * up reads each thread's gate
and up accumulators side by side only if its B interleaves them in blocks of `GLU_BLOCK` rows:
rows 16j..16j+7 are gate rows 8j..8j+7, rows 16j+8..16j+15 up rows 8j..8j+7. Then D's column
8j + c is act(gate row 8j + c) * (up row 8j + c): the same M x I as the split layout gives, in
the same column order. A copy made once, at load time (never per call).

The layer's GLU stage (`gate_up_glu`, run by `_moe.experts_forward` where `glu_reason` finds no
obstacle and no gradient is needed): the gate_up grouped GEMM with act(gate) * up in its epilogue
("silu+glu") on these weights, kept per weight tensor and version (`glu_weights`), instead of
the GEMM of 2I columns and the activation pass.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .._torch import ACTIVATION, glu_halves
from ..space import GLU_BLOCK, Activation, DType, Epilogue, Layout, Pair, Problem
from ..tables import BestTableError
from . import _lowering, _native
from ._dispatch import (
    Call,
    Kind,
    _device_rows,
    current_stream,
    eager_direct_allowed,
    input_not_taken,
    prepare,
    warn_once,
)
from ._grouped import _may_keep, grouped_problem_of, grouped_signature, run_grouped, torch_grouped_mm
from ._matmul import MatmulInputError
from ._moe import ExpertActivation, ExpertsLayout, GateForm, MoEInputError
from ._op import _on_device_of, forward_op, registered_table
from ._table import BestTable, Match

_log = logging.getLogger(__name__)


def _blocks(weight: torch.Tensor, name: str) -> tuple[int, int, int]:
    if weight.dim() != 3:
        raise MoEInputError(f"{name} must be E x 2I x H (one gate_up per expert), not of shape {tuple(weight.shape)}")
    e, n, h = weight.shape
    if n % (2 * GLU_BLOCK):
        raise MoEInputError(f"{name}'s 2I = {n} rows must be a multiple of {2 * GLU_BLOCK} (gate and up in blocks of "
                            f"{GLU_BLOCK})")
    return e, n, h


def interleave_gate_up(gate_up: torch.Tensor) -> torch.Tensor:
    """transformers' gate_up_proj (E x 2I x H: gate rows, then up rows) with gate and up
    interleaved in blocks of `GLU_BLOCK` rows, E x 2I x H, contiguous (a new tensor).

    Raises:
        MoEInputError: not 3-d, or 2I not a multiple of 2 * GLU_BLOCK.
    """
    e, n, h = _blocks(gate_up, "gate_up")
    # (E, gate/up, I / 8, 8, H) -> (E, I / 8, gate/up, 8, H)
    return gate_up.reshape(e, 2, n // (2 * GLU_BLOCK), GLU_BLOCK, h).transpose(1, 2).reshape(e, n, h).contiguous()


def split_gate_up(interleaved: torch.Tensor) -> torch.Tensor:
    """The inverse of `interleave_gate_up`: gate rows, then up rows (a new tensor).

    Raises:
        MoEInputError: not 3-d, or 2I not a multiple of 2 * GLU_BLOCK.
    """
    e, n, h = _blocks(interleaved, "interleaved gate_up")
    return interleaved.reshape(e, n // (2 * GLU_BLOCK), 2, GLU_BLOCK, h).transpose(1, 2).reshape(e, n, h).contiguous()


# ---------------------------------------------------------------------------------------------
# The layer's GLU stage: the gate_up GEMM with act(gate) * up in its epilogue


def glu_epilogue(activation: ExpertActivation) -> Epilogue | str:
    """The epilogue of the gate_up GEMM that computes the layer's activation itself (its
    function of the gate times the up, the pair interleaved: "silu+glu"), or why none does."""
    if activation.form is GateForm.NONE:
        return "the experts are not gated (act(h): no gate and up pair to fuse)"
    if activation.form is GateForm.SWIGLU_OAI:
        return "GPT-OSS's clamped SwiGLU (clamps, sigmoid slope, up + 1) is not the GLU node's act(gate) * up"
    if activation.limit is not None:
        return f"gate and up are clamped at {activation.limit} before the product, which the GLU node does not do"
    return Epilogue(activation=activation.function, pair=Pair.INTERLEAVED)


_GLU_DTYPES = {torch.bfloat16: DType.BF16, torch.float16: DType.F16}


def glu_problem(layout: ExpertsLayout, dtype: torch.dtype, routed_rows: int) -> Problem | str:
    """The grouped GLU gate_up problem of a layer (E experts, N = 2I, K = H, "tn": the
    interleaved weights are an E x 2I x H stack read transposed) at `routed_rows`, or why the
    layer has none."""
    epilogue = glu_epilogue(layout.activation)
    if isinstance(epilogue, str):
        return epilogue
    dt = _GLU_DTYPES.get(dtype)
    if dt is None:
        return f"the weights are {dtype}; the GLU kernels take bfloat16 or float16"
    n = 2 * layout.intermediate
    if n % (2 * GLU_BLOCK):
        return f"2I = {n} is not a multiple of {2 * GLU_BLOCK} (gate and up in blocks of {GLU_BLOCK})"
    return Problem.experts(layout.experts, n, layout.hidden, routed_rows, dtype_a=dt, dtype_b=dt, dtype_d=dt,
                           layout_b=Layout.COL, epilogue=epilogue)


def _table_row(key: str, device: int, problem: Problem) -> str:
    """'' where the table registered under `key` has a row of CUDA device `device`'s GPU model
    for the GLU problem's experts, N and K (any routed rows: the nearest runs), else why not."""
    if not _runs_kernels(device):
        return "the weights are not on a CUDA device"
    rows, other_gpu = _device_rows(registered_table(key), device)
    if other_gpu is not None:
        return other_gpu
    if rows.frame.empty:  # a table of no rows (torch's everywhere) has no operation columns to look in
        return "the table has no rows"
    try:
        glu = rows.find(problem.m, problem.n, problem.k, problem.operation, groups=problem.groups)
    except BestTableError:
        return (f"the table has no row of {problem.operation.name} for {problem.groups} experts of "
                f"{problem.n}x{problem.k} on this GPU (tune it: cutlass-tune sweep --shapes "
                f"e{problem.groups}:ROWSx{problem.n}x{problem.k} --epilogue {problem.epilogue.name}, ROWS the "
                "routed rows: tokens x top_k)")
    return _slower_than_apart(rows, problem, glu)


def _figure(match: Match) -> float:
    """A row's ratio as the dispatcher reads it (`Match.dispatch_ratio`), its claim where that
    is a sweep's single launches (NaN there)."""
    ratio, _ = match.dispatch_ratio()
    return ratio if math.isfinite(ratio) else match.ratio


def _ns_per_row(match: Match) -> float:
    """A row's kernel time per routed row (its `median_ms` over its `m`), NaN where it has none."""
    try:
        return float(match.row["median_ms"]) * 1e6 / int(match.row["m"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return math.nan


def _slower_than_apart(rows: BestTable, problem: Problem, glu: Match) -> str:
    """Why the GLU row's kernel loses to the gate_up GEMM and the activation pass run apart, or ''
    where it does not. Two tests, both needed:

    - ratios: the GLU row's ratio r_g is to torch's GEMM and activation (T + t); the path apart runs
      the plain row's kernel (r_p to torch's GEMM T) or torch's GEMM, whichever is faster: T /
      max(r_p, 1) + t. The GLU kernel's (T + t) / r_g is no more where r_g >= max(r_p, 1). Without
      a plain row, r_p is torch's GEMM's 1.
    - kernel times: the bench's t is torch's activation in eager (three passes), more than the
      layer's own pass (one, fused by Inductor compiled), so r_g can pass where the GLU kernel
      loses in the layer (DeepSeek-V2-Lite's on an H200: r_g 1.55 against r_p 1.04, the GLU
      kernel 21.1 ns a routed row against the plain kernel's 17.9, the layer 4% slower with it).
      So where both rows have their kernel's time, the GLU kernel must take no more per routed
      row than the plain one (it then also saves the pass: a sufficient condition).

    Compared at the GLU row's routed rows (the nearest plain row's time scaled per row)."""
    routed = int(glu.row["m"])
    plain_problem = Problem.experts(problem.groups, problem.n, problem.k, routed, dtype_a=problem.dtype_a,
                                    dtype_b=problem.dtype_b, dtype_d=problem.dtype_d, layout_b=Layout.COL)
    try:
        plain_match: Match | None = rows.find(routed, problem.n, problem.k, plain_problem.operation,
                                              groups=problem.groups)
    except BestTableError:
        plain_match = None
    plain = _figure(plain_match) if plain_match is not None else math.nan
    apart = f"the plain gate_up kernel's {plain:.3f}x torch's GEMM" if plain > 1.0 else "torch's path (1.0)"
    plain = max(plain, 1.0) if math.isfinite(plain) else 1.0
    ours = _figure(glu)
    layer = f"{problem.groups} experts of {problem.n}x{problem.k}"
    if ours < plain:
        return (f"the table's GLU kernel for {layer} was measured at {ours:.3f}x torch's GEMM and activation, "
                f"below {apart}")
    if plain_match is None:
        return ""
    glu_ns, plain_ns = _ns_per_row(glu), _ns_per_row(plain_match)
    if glu_ns > plain_ns:  # False where either is NaN
        return (f"the table's GLU kernel for {layer} takes {glu_ns:.1f} ns a routed row, more than the plain "
                f"gate_up kernel's {plain_ns:.1f} (its rows' kernel times; apart, the activation pass is one more)")
    return ""


def _runs_kernels(device: int) -> bool:
    """Whether a layer on device index `device` (-1: the CPU) can run kernels."""
    return device >= 0


_reasons: dict[tuple, str] = {}


@torch.compiler.assume_constant_result
def _glu_reason(key: str | None, device: int, experts: int, hidden: int, intermediate: int, dtype: str,
                function: str, form: str, interleaved: bool, limit: float | None, bias: bool) -> str:
    """`glu_reason` on plain values: torch.compile calls it once while tracing and keeps its
    answer (no guard: a table registered again later still runs, its plan falls back to torch
    where it has no GLU row). Logged once per answer (INFO, this module's logger) for a gated
    layer on a CUDA device: which path and why. Not a warning: the unfused path is no fallback to
    torch (its GEMMs are the table's), and a table tuned before GLU rows existed is the common case."""
    table = registered_table(key) if key is not None else None
    cache_key = (key, id(table), device, experts, hidden, intermediate, dtype, function, form, interleaved, limit,
                 bias)
    found = _reasons.get(cache_key)
    if found is not None:
        return found
    activation = ExpertActivation(Activation(function), GateForm(form), interleaved, limit)
    layout = ExpertsLayout(experts, hidden, intermediate, activation, False)
    problem = glu_problem(layout, getattr(torch, dtype), experts)
    if isinstance(problem, str):
        reason = problem
    elif bias:
        reason = "gate_up has a bias, which the GLU kernel does not add before the pair"
    elif key is None:
        reason = "no table"
    else:
        reason = _table_row(key, device, problem)
    if activation.gated and _runs_kernels(device):
        layer = f"{experts} experts of {2 * intermediate}x{hidden} ({dtype}, {activation.form.value} {function})"
        if isinstance(problem, Problem) and not reason:
            _log.info("cutlass_tune.moe_experts: %s: gate_up runs the GLU kernel (%s)", layer, problem.operation.name)
        else:
            _log.info("cutlass_tune.moe_experts: %s: the gate_up GEMM and the activation run apart: %s", layer, reason)
    _reasons[cache_key] = reason
    return reason


def glu_reason(layout: ExpertsLayout, gate_up: torch.Tensor, key: str | None, gate_up_bias: torch.Tensor | None) -> str:
    """Why the layer's gate_up GEMM cannot take its activation into its epilogue (the GLU
    stage), or '' where it can: the activation is act(gate) * up without clamps, no gate_up
    bias, 16-bit weights, 2I whole blocks of gate and up, and the table (`key`) has a row of
    this GPU for the GLU problem (`glu_problem`). Gradients are the caller's condition (the GLU
    kernel keeps neither gate nor up for a backward). A function of the layer alone: traced
    once by torch.compile, asked once per layer in eager code (kept)."""
    activation = layout.activation
    return _glu_reason(key, gate_up.get_device(), layout.experts, layout.hidden, layout.intermediate,
                       str(gate_up.dtype).removeprefix("torch."), activation.function.value, activation.form.value,
                       activation.interleaved, activation.limit, gate_up_bias is not None)


_laid_out: dict[tuple, tuple[StorageWeakRef, int, torch.Tensor]] = {}
_laid_out_lock = threading.Lock()


def _lay_out(gate_up: torch.Tensor, transposed: bool, alternating: bool) -> torch.Tensor:
    with torch.no_grad():
        split = gate_up.detach().transpose(-2, -1) if transposed else gate_up.detach()
        if alternating:  # gate and up rows alternate one by one (GPT-OSS's order)
            split = torch.cat((split[:, 0::2], split[:, 1::2]), dim=1)
        return interleave_gate_up(split)


def _lay_out_in_a_thread(gate_up: torch.Tensor, transposed: bool, alternating: bool, device: int) -> torch.Tensor:
    """`_lay_out` by a thread of its own, finished on the device before it returns: CUDA graph
    trees send every allocation of the thread that warms them up to their graphs' pool, whose
    memory must not outlive a run, and these weights are kept."""
    torch.cuda.current_stream(device).synchronize()  # the weights' last writes, seen by the other thread's stream
    made: list[torch.Tensor] = []
    failed: list[BaseException] = []

    def lay_out() -> None:
        try:
            with torch.cuda.device(device):
                made.append(_lay_out(gate_up, transposed, alternating))
                torch.cuda.current_stream(device).synchronize()
        except BaseException as err:  # noqa: BLE001 - raised again in the caller's thread
            failed.append(err)

    worker = threading.Thread(target=lay_out, name="cutlass_tune GLU weights")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    return made[0]


def _version(t: torch.Tensor) -> int:
    """t's version counter; -1 for an inference tensor (made under torch.inference_mode), which has none."""
    try:
        return t._version
    except RuntimeError:
        return -1


def glu_weights(gate_up: torch.Tensor, transposed: bool, alternating: bool) -> torch.Tensor | None:
    """The layer's gate_up weights interleaved for the GLU kernel (E x 2I x H contiguous),
    made once per weight and kept while the weight's storage lives and its version stays (an
    in-place update, a load_state_dict, lays them out again): never per call. None inside CUDA
    graph capture where none is kept yet (the caller computes without them: run the layer once
    before capturing).

    `gate_up`: E x 2I x H, gate rows then up rows (`alternating`: one by one), or E x H x 2I
    `transposed`. Thread-safe. Where torch.compile's CUDA graph trees route this thread's
    allocations to their pool (their warm-up), the copy is made by another thread (`_lay_out_in_a_thread`).
    """
    storage = gate_up.untyped_storage()
    key = (storage._cdata, gate_up.storage_offset(), gate_up.shape, gate_up.stride(), gate_up.dtype, transposed,
           alternating)
    found = _laid_out.get(key)
    version = _version(gate_up)
    if found is not None and found[1] == version and not found[0].expired():
        return found[2]
    with _laid_out_lock:
        for stale in [k for k, v in _laid_out.items() if v[0].expired()]:
            del _laid_out[stale]
        if gate_up.is_cuda and torch.cuda.is_current_stream_capturing():
            return None
        device = gate_up.get_device()
        if gate_up.is_cuda and not _may_keep(device, current_stream(device)):
            laid = _lay_out_in_a_thread(gate_up, transposed, alternating, device)
        else:
            laid = _lay_out(gate_up, transposed, alternating)
        _laid_out[key] = (StorageWeakRef(storage), version, laid)
        return laid


def _torch_glu(rows: torch.Tensor, weights: torch.Tensor, offs: torch.Tensor, function: Activation) -> torch.Tensor:
    """What the GLU kernel computes, by torch: its grouped GEMM on the interleaved weights, then
    act(gate) * up of the interleaved pair."""
    gate, up = glu_halves(torch_grouped_mm(rows, weights.transpose(-2, -1), offs), Pair.INTERLEAVED)
    return ACTIVATION[function](gate) * up


def _unlaid(rows: torch.Tensor, gate_up: torch.Tensor, offs: torch.Tensor, key: str, function: Activation,
            transposed: bool, alternating: bool) -> torch.Tensor:
    """The stage without its laid-out weights (CUDA graph capture before any call): the plain
    gate_up GEMM, then the activation by torch."""
    warn_once("moe glu capture", "cutlass_tune.moe_experts: the GLU weights were not laid out before CUDA graph "
              "capture (run the layer once first); this graph runs the gate_up GEMM and the activation apart")
    b = gate_up if transposed else gate_up.transpose(-2, -1)
    h = run_grouped(registered_table(key), rows, b, offs, None, True, 1.0)
    return ExpertActivation(function, GateForm.GLU, alternating)(h)


def _gate_up_glu_cuda(rows: torch.Tensor, gate_up: torch.Tensor, offs: torch.Tensor, table: str, activation: str,
                      transposed: bool, alternating: bool) -> torch.Tensor:
    """act(gate) * up of each routed row through its expert's gate_up (`gate_up_glu`) by the
    table's grouped GLU kernel (min_ratio 0: the layer chose the stage by the table's figures,
    `glu_reason`), launched from C++ where the native library is loaded (its `grouped_glu`,
    resolved by `_resolve_glu_door`); torch where the table has no row of this GPU or the
    tensors are ones no kernel takes (one warning per cause)."""
    function = Activation(activation)
    weights = glu_weights(gate_up, transposed, alternating)
    with _on_device_of(rows):
        if weights is None:
            return _unlaid(rows, gate_up, offs, table, function, transposed, alternating)
        try:
            door = _native.door
            if door is not None:
                return door.grouped_glu(rows, weights.transpose(-2, -1), offs,
                                        _native.door_key(registered_table(table)), activation)
            return _glu_door_python(rows, weights.transpose(-2, -1), offs, registered_table(table), function)
        except MatmulInputError as err:
            input_not_taken("moe_experts", err, "torch's grouped GEMM and act(gate) * up")
            return _torch_glu(rows, weights, offs, function)


def _glu_door_python(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, table: BestTable,
                     function: Activation) -> torch.Tensor:
    return run_grouped(table, a, b, offs, None, True, 0.0, activation=function, pair=Pair.INTERLEAVED)


def _resolve_glu_door(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, key: str, activation: str) -> tuple:
    """The native plan entry of a GLU stage's call (`_native.register_door`): its plan by the
    Python path's signature (checked as that path checks it, raising as it does), its kernel, or
    the Python path for every other outcome (torch's GEMM and activation are computed there)."""
    table = _native.door_table(key)
    function = Activation(activation)
    signature = grouped_signature(a, b, offs, None, 0.0, True, function, Pair.INTERLEAVED)
    ready = table.plans.get(signature)
    if ready is None:
        problem = grouped_problem_of(a, b, offs, None, None, None, function, Pair.INTERLEAVED)
        ready = prepare(table, Call(Kind.GROUPED, problem, a.get_device(), 0.0, signature, True))
    return _native.plan_entry(ready, torch_path=False)


def _glu_door(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, key: str, activation: str) -> torch.Tensor:
    return _glu_door_python(a, b, offs, _native.door_table(key), Activation(activation))


_native.register_door("grouped_glu door", _resolve_glu_door, _glu_door)


def _gate_up_glu_cpu(rows: torch.Tensor, gate_up: torch.Tensor, offs: torch.Tensor, table: str, activation: str,
                     transposed: bool, alternating: bool) -> torch.Tensor:
    registered_table(table)
    weights = glu_weights(gate_up, transposed, alternating)
    assert weights is not None, "no CUDA graph captures a CPU call"
    return _torch_glu(rows, weights, offs, Activation(activation))


def _gate_up_glu_fake(rows: torch.Tensor, gate_up: torch.Tensor, offs: torch.Tensor, table: str, activation: str,
                      transposed: bool, alternating: bool) -> torch.Tensor:
    _lowering.ensure("moe_gate_up_glu")
    registered_table(table)
    n = gate_up.shape[-1] if transposed else gate_up.shape[-2]
    return rows.new_empty((rows.shape[0], n // 2))


def _gate_up_glu_into(rows: torch.Tensor, gate_up: torch.Tensor, offs: torch.Tensor, table: str, activation: str,
                      transposed: bool, alternating: bool, out: torch.Tensor) -> None:
    """The GLU operator's extern kernel in a compiled graph (runtime/_lowering.py): the native
    library's GLU door writing into Inductor's buffer `out`, no dispatcher and no Python operator
    between (Inductor's graph runs on the rows' device); what `_gate_up_glu_cuda` computes
    otherwise, copied in."""
    weights = glu_weights(gate_up, transposed, alternating)
    door = _native.door
    if weights is not None and door is not None:
        try:
            door.grouped_glu_out(rows, weights.transpose(-2, -1), offs, _native.door_key(registered_table(table)),
                                 activation, out)
            return
        except MatmulInputError as err:
            input_not_taken("moe_experts", err, "torch's grouped GEMM and act(gate) * up")
            out.copy_(_torch_glu(rows, weights, offs, Activation(activation)))
            return
    out.copy_(_gate_up_glu_cuda(rows, gate_up, offs, table, activation, transposed, alternating))


def _glu_kernel() -> Any:
    door = _native.door
    return _gate_up_glu_into if door is not None and hasattr(door, "grouped_glu_out") else None


_lowering.register_kernel("moe_gate_up_glu", _glu_kernel)

gate_up_glu_op: Any = forward_op("moe_gate_up_glu(Tensor rows, Tensor gate_up, Tensor offs, str table, str activation, "
                                 "bool transposed, bool alternating) -> Tensor", _gate_up_glu_cuda, _gate_up_glu_cpu,
                                 _gate_up_glu_fake)
"""The GLU stage as an operator (torch.compile traces it with no graph break; CUDA graphs capture
it). Forward only, no autograd kernel: the layer runs it where no gradient is needed (`glu_reason`)."""


def gate_up_glu(rows: torch.Tensor, gate_up: torch.Tensor, offs: torch.Tensor, key: str,
                layout: ExpertsLayout) -> torch.Tensor:
    """The layer's gate_up GEMM and activation in one grouped GLU kernel: routed rows (S x H,
    sorted by expert, `offs` their E int32 row ends) in, act(gate) * up (S x I) out, the
    weights as the layer holds them (`gate_up`: E x 2I x H, or E x H x 2I `layout.transposed`)
    laid out once (`glu_weights`). Rows past offs[-1] are left as found. Eager calls skip the
    operator's dispatch (`eager_direct_allowed`)."""
    activation = layout.activation
    args = (rows, gate_up, offs, key, activation.function.value, layout.transposed, activation.interleaved)
    if eager_direct_allowed(rows, gate_up, native_op=False):  # an operator defined in Python: skip its dispatch
        return _gate_up_glu_cuda(*args)
    return gate_up_glu_op(*args)
