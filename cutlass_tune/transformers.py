"""The MoE experts layer, on tuned grouped GEMMs, for transformers models (transformers >= 5).

Importing this module registers the experts implementation "cutlass_tune" in
`transformers.integrations.moe.ExpertsInterface`: the fused experts layer
(`cutlass_tune.moe_experts`: routing on the device, gather, the gate_up and down projections run
by the tuned grouped GEMMs of the table given to `use_table`, the activation, one deterministic
combine with the routing weights) for every family it computes (gated and non-gated experts,
biases, GPT-OSS's clamped SwiGLU, post-expert norms); other experts run transformers'
"grouped_mm" torch glue around the same tuned GEMMs, with one warning naming why:

    import cutlass_tune.transformers as ct
    ct.use_table("bundle/")                     # a bundle, table file, store or BestTable
    model = AutoModelForCausalLM.from_pretrained(name, experts_implementation="cutlass_tune")
    # or: model.set_experts_implementation("cutlass_tune")
    ct.use_table("bundle/", model=model)        # before torch.compile: its experts planned now

At decode sizes the layer may run batched GEMMs instead (`use_table(table, decode=...)`,
`CUTLASS_TUNE_MOE_BATCHED_ROWS`): transformers switches only its own "grouped_mm" experts to
"batched_mm" while generating. Experts whose shapes the table has not tuned run torch's grouped
GEMM (one warning per shape), so the model's outputs never depend on the table, only its speed.
In inference, where the table has the GLU row of a layer's gate_up problem (e.g. "silu+glu"),
the fused layer runs its gate_up GEMM with the activation in the epilogue (`moe_experts`'s GLU
stage, on gate_up weights interleaved once and kept beside the model's; `use_table(table,
glu=False)` turns it off).
The operator has a backward and no graph break under torch.compile; eager inference (no
gradient needed, nothing traced) calls the kernel without the operator's dispatch, with a
workspace kept per thread and stream.
Needs `pip install 'cutlass-tune[transformers]'`.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import torch

from .errors import CutlassTuneError
from .runtime import BestTable, register_table
from .runtime import _moe_routing as routing
from .runtime._dispatch import eager_direct_allowed, input_not_taken, warn_once
from .runtime._grouped import grouped_mm, torch_grouped_mm
from .runtime._grouped_op import grouped_mm_op
from .runtime._matmul import MatmulInputError
from .runtime._moe import ExpertsLayout, MoEDecode, MoEInputError, activate, experts_forward, moe_decode, runs_batched
from .runtime._moe_gates import experts_plan
from .runtime._moe_glu import _glu_reason, gate_up_glu_op
from .runtime._op import registered_table

try:
    from transformers.integrations.moe import ExpertsInterface
except ImportError as err:  # a one-line reason instead of transformers' traceback
    raise ImportError("cutlass_tune.transformers needs transformers >= 5 (pip install "
                      "'cutlass-tune[transformers]')") from err

NAME = "cutlass_tune"
"""The experts implementation's name (`experts_implementation="cutlass_tune"`)."""
TABLE_KEY = "cutlass_tune.transformers"
"""The key the table of `use_table` is registered under (`register_table`)."""


class NoTableError(CutlassTuneError, RuntimeError):
    """A model runs the "cutlass_tune" experts before `use_table` gave them a table."""


_lock = threading.Lock()
_table_set = False
_decode = MoEDecode.AUTO
_decode_name = _decode.value
_glu = True


def use_table(table: BestTable | str | Path, *, decode: MoEDecode | str = "auto", glu: bool = True,
              model: torch.nn.Module | None = None) -> str:
    """The best-config table the "cutlass_tune" experts of every model in this process run
    (replacing an earlier one, also for graphs compiled with it). Thread-safe.

    Give `model` before torch.compile: each of its experts modules is planned now, in eager code
    (`experts_plan`: its gate checked on a probe, the plan kept on the module with its index),
    so the compiled inference layers trace only plain values decided from the plan (the lean
    path, `_lean_choice`) and guard on less: on a tiny OLMoE decoder layer (CPU) Dynamo's guard
    check costs 1.01-1.07x the "grouped_mm" layer's per call, 1.2-1.6x on the full path, 1.8x
    with no plan (benchmarks/moe_layer.md). Without `model` a layer first called compiled
    traces its plan (unchecked by the probe) on each compile.

    Args:
        table: a `BestTable`, or what `BestTable.load` reads (bundle, table file, store).
        decode: how the fused layer runs its GEMMs (`moe_experts`'s `decode`): "auto" (batched
            up to `CUTLASS_TUNE_MOE_BATCHED_ROWS` routed rows, grouped above), "grouped" or
            "batched". transformers switches only its own "grouped_mm" experts to "batched_mm"
            at decode; this is the "cutlass_tune" experts' own choice, made per call by shape.
        glu: the fused layer's GLU stage in inference where the table has a GLU row
            (`moe_experts`'s `glu`, on by default; False: the GEMM and the activation pass
            apart, and no interleaved copy of the gate_up weights).

    Returns:
        Its key (`TABLE_KEY`).

    Raises:
        MatmulInputError: `table` is neither a `BestTable` nor a path (a DataFrame: `BestTable(frame)`).
        MoEInputError: a `decode` that names no path; `model` not an nn.Module.
        BestTableError, BundleError, StoreError: a path that cannot be read as a table.
    """
    global _table_set, _decode, _decode_name, _glu
    if not isinstance(table, (BestTable, str, os.PathLike)):
        hint = " (a best-config frame: BestTable(frame))" if hasattr(table, "columns") else ""
        raise MatmulInputError(f"use_table takes a BestTable or a path, not {type(table).__name__}{hint}")
    chosen = moe_decode(decode)
    if model is not None and not isinstance(model, torch.nn.Module):
        raise MoEInputError(f"use_table's model must be a torch.nn.Module, not {type(model).__name__}")
    with _lock:
        key = register_table(table, key=TABLE_KEY)
        _table_set = True
        _decode = chosen
        _decode_name = chosen.value
        _glu = bool(glu)
    if model is not None:
        plan_experts(model)
    return key


def plan_experts(model: torch.nn.Module) -> int:
    """Plan every experts module of `model` in eager code (`use_table`'s `model`): each one's
    plan checked on a probe and kept on the module. Returns how many were planned."""
    modules = experts_modules(model)
    for module in modules:
        _keep_index(module, experts_plan(module))
    return len(modules)


def experts_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformers experts modules of `model` (those the "cutlass_tune" experts run: a
    down_proj weight stack and the `has_gate` the experts implementations read)."""
    return [m for m in model.modules() if hasattr(m, "has_gate") and isinstance(getattr(m, "down_proj", None),
                                                                                 torch.Tensor)]


def _direct_grouped_mm(x: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """The operator's CUDA implementation without its dispatch: the table's kernel, this
    thread's workspace kept (no CUDA graph pool can be involved outside the operator), torch's
    grouped GEMM for tensors no kernel takes."""
    try:
        return grouped_mm(x, b, offs, table=registered_table(TABLE_KEY))
    except MatmulInputError as err:
        input_not_taken("grouped_mm", err, "torch's grouped GEMM")
        return torch_grouped_mm(x, b, offs)


def _grouped_linear(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor, bias: torch.Tensor | None,
                    is_transposed: bool) -> torch.Tensor:
    """x's rows through their experts' weights: E x N x K weights (nn.Linear's, the "tn"
    problem), or E x K x N ones with `is_transposed` ("tt"). Eager inference calls the kernel
    directly (`eager_direct_allowed`); training, torch.compile and tracing go through the operator."""
    b = weight if is_transposed else weight.transpose(-2, -1)
    x = x.to(weight.dtype)
    direct = eager_direct_allowed(x, weight)
    out = _direct_grouped_mm(x, b, offs) if direct else grouped_mm_op(x, b, offs, TABLE_KEY)
    return out if bias is None else out + bias


def glue_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                 top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' "grouped_mm" experts forward with the tuned grouped GEMM and transformers'
    torch glue around it: what the experts the layer does not compute run (`experts_plan`)."""
    device = hidden_states.device
    num_top_k = top_k_index.size(-1)
    num_tokens, hidden_dim = hidden_states.size(0), hidden_states.size(-1)
    sample_weights = top_k_weights.reshape(-1)
    expert_ids = top_k_index.reshape(-1)

    expert_ids_g, perm = torch.sort(expert_ids)
    selected = hidden_states[perm // num_top_k]
    sample_weights_g = sample_weights[perm]
    # histc, not bincount: no host sync, so CUDA graphs can capture it (as transformers does)
    counts_input = expert_ids_g.float() if device.type in ("cpu", "mps") else expert_ids_g.int()
    counts = torch.histc(counts_input, bins=self.num_experts, min=0, max=self.num_experts - 1)
    offs = torch.cumsum(counts, dim=0, dtype=torch.int32)

    # Expert parallelism: ids past the local experts sort last and fall outside offs; their
    # rows are zeroed before the GEMM and after each (the kernel leaves rows past offs[-1]).
    sentinel = None
    if getattr(self, "_is_expert_parallel", False):
        sentinel = (expert_ids_g >= self.num_experts).unsqueeze(-1)
        expert_ids_g = expert_ids_g.clamp(max=self.num_experts - 1)
        selected = selected.masked_fill(sentinel, 0.0)

    if self.has_gate:
        weights = self.gate_up_proj
        biases = self.gate_up_proj_bias[expert_ids_g] if self.has_bias else None
    else:
        weights = self.up_proj
        biases = self.up_proj_bias[expert_ids_g] if self.has_bias else None
    out = _grouped_linear(selected, weights, offs, biases, self.is_transposed)
    if sentinel is not None:
        out = out.masked_fill(sentinel, 0.0)
    out = self._apply_gate(out) if self.has_gate else self.act_fn(out)

    biases = self.down_proj_bias[expert_ids_g] if self.has_bias else None
    out = _grouped_linear(out, self.down_proj, offs, biases, self.is_transposed)
    if sentinel is not None:
        out = out.masked_fill(sentinel, 0.0)
    if getattr(self, "has_post_expert_norm", False):
        out = self.post_expert_norm(out)

    weighted = out * sample_weights_g.unsqueeze(-1)
    inv_perm = torch.empty_like(perm)
    inv_perm[perm] = torch.arange(perm.size(0), device=device)
    weighted = weighted[inv_perm]
    return weighted.view(num_tokens, num_top_k, hidden_dim).sum(dim=1).to(hidden_states.dtype)


def cutlass_tune_experts_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                                 top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts forward of transformers' "grouped_mm" implementation, computed by the fused
    experts layer (`cutlass_tune.moe_experts`: routing, gather, tuned grouped GEMMs, combine)
    for the families it computes (gated or not, biases, GPT-OSS's clamped SwiGLU, post-expert
    norms); other experts run the tuned GEMMs with transformers' torch glue (`glue_forward`),
    with one warning naming why.

    Raises:
        NoTableError: `use_table` was not called in this process.
    """
    if _compiling():
        lean = _lean_call(self, hidden_states, top_k_index, top_k_weights)
        if lean is not None:
            return lean
    if not _table_set:
        raise NoTableError('the "cutlass_tune" experts need a table: call cutlass_tune.transformers.use_table(table) '
                           "first")
    plan = experts_plan(self)
    if not torch.compiler.is_compiling():
        _keep_index(self, plan)
    if isinstance(plan, str):
        if not torch.compiler.is_compiling():
            warn_once(plan, f"cutlass_tune.transformers: {plan}; its layers run the tuned GEMMs with transformers' "
                      "torch glue")
        return glue_forward(self, hidden_states, top_k_index, top_k_weights)
    gated = self.has_gate
    return experts_forward(
        hidden_states, top_k_index, top_k_weights, self.gate_up_proj if gated else self.up_proj, self.down_proj,
        plan, TABLE_KEY,
        gate_up_bias=(self.gate_up_proj_bias if gated else self.up_proj_bias) if self.has_bias else None,
        down_bias=self.down_proj_bias if self.has_bias else None,
        expert_parallel=getattr(self, "_is_expert_parallel", False),
        post=self.post_expert_norm if getattr(self, "has_post_expert_norm", False) else None, decode=_decode,
        glu=_glu)


# ---------------------------------------------------------------------------------------------
# The lean traced path: what a compiled experts layer reads in Python, each read a guard that
# Dynamo checks on every call of the compiled frame. Measured what costs (CPU, transformers 5.17,
# benchmarks/guard_cost_cpu.py): a `getattr(module, name, default)` of an attribute the module
# lacks is a NO_HASATTR guard, nn.Module.__getattr__ raising AttributeError on every check
# (4.4 us each); `torch` reached through this module's globals besides the model's own is an
# aliasing guard checked in Python; an enum member's `.value` guards the member, its class and
# the enum's property. So the traced code reads one int the module was given in eager code,
# names bound here (not `torch.x`), string literals and the constants `_lean_choice` returns.

_INDEX = "_cutlass_tune_plan_index"
"""The experts module's attribute holding its plan's index in `_plans` (-1: the full path)."""
_plans: list[ExpertsLayout] = []
"""The plans made in eager code, each once (layers of one shape share one: no recompile per layer)."""
_plan_index: dict[ExpertsLayout, int] = {}
_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_route_op: Any = None
"""The native routing, gather and combine operators, bound by `_lean_choice` once it finds them."""
_gather_op: Any = None
_combine_op: Any = None


def _keep_index(module: Any, plan: ExpertsLayout | str) -> None:
    """Keep on `module`, planned in eager code, the index of its plan in `_plans` (an int: the
    compiled layer's lean path guards that, not the plan's fields), or -1 where its compiled
    calls take the full path: no plan, biases, expert parallelism, a post-expert norm (read
    here once, as the model stands when planned, not on every compiled call)."""
    if getattr(module, _INDEX, None) is not None:
        return
    if isinstance(plan, str) or module.has_bias or getattr(module, "_is_expert_parallel", False) \
            or getattr(module, "has_post_expert_norm", False):
        setattr(module, _INDEX, -1)
        return
    with _lock:
        index = _plan_index.setdefault(plan, len(_plans))
        if index == len(_plans):
            _plans.append(plan)
    setattr(module, _INDEX, index)


def _lean_call(self: Any, hidden: torch.Tensor, top_k_index: torch.Tensor,
               top_k_weights: torch.Tensor) -> torch.Tensor | None:
    """The fused layer of a compiled inference call whose plan was made in eager code, traced
    from plain values only (`_lean_choice`), calling the operators itself; None where the call
    needs what only the full path (`experts_forward`) handles: no plan, biases, expert
    parallelism, a post-expert norm (`_keep_index`), gradients, the batched GEMMs. Same kernels
    and results as the full path; fewer guards (benchmarks/moe_layer.md)."""
    index = getattr(self, "_cutlass_tune_plan_index", -1)  # `_INDEX` spelt out: a global read is a guard
    if index < 0:
        return None
    gate_up = self.gate_up_proj if self.has_gate else self.up_proj
    down = self.down_proj
    if _grad_enabled() and (gate_up.requires_grad or down.requires_grad or hidden.requires_grad
                            or top_k_weights.requires_grad):
        return None
    choice = _lean_choice(index, _decode_name, _glu, gate_up.get_device(), gate_up.dtype, top_k_index.dtype,
                          top_k_index.numel())
    if choice is None:
        return None
    key, native, glu_runs, experts, transposed, function, form, interleaved, limit, alpha = choice
    top_k = top_k_index.shape[-1]
    x = hidden.to(gate_up.dtype)
    weights = top_k_weights.reshape(-1, top_k).float()
    if native:
        _, perm, inv, offsets = _route_op(top_k_index.reshape(-1), experts)
        rows = _gather_op(x, inv, None, top_k)
    else:
        _, perm, inv, offsets, _ = routing.torch_routing(top_k_index, experts)
        rows = routing._torch_gather(x, perm, inv, None, top_k)
    if glu_runs:
        h = gate_up_glu_op(rows, gate_up, offsets, key, function, transposed, interleaved)
    else:
        h = grouped_mm_op(rows, gate_up if transposed else gate_up.transpose(-2, -1), offsets, key)
        h = activate(h, function, form, interleaved, limit, alpha)
    y = grouped_mm_op(h.to(down.dtype), down if transposed else down.transpose(-2, -1), offsets, key)
    if native:
        out = _combine_op(y, inv, weights, top_k)
    else:
        out = routing._torch_combine(y, perm, inv, weights, top_k)
    return out.to(hidden.dtype)


@torch.compiler.assume_constant_result
def _lean_choice(index: int, decode: str, glu: bool, device: int, dtype: torch.dtype, ids_dtype: torch.dtype,
                 routed_rows: int) -> tuple | None:
    """What the lean path runs, decided in Python while the layer is traced (a constant of the
    graph): (table key, native routing, GLU stage, experts, transposed, function, form,
    interleaved, limit, alpha), or None for a call the full path runs (the batched GEMMs)."""
    global _route_op, _gather_op, _combine_op
    plan = _plans[index]
    if runs_batched(MoEDecode(decode), routed_rows):
        return None
    activation = plan.activation
    function, form = activation.function.value, activation.form.value
    glu_runs = glu and not _glu_reason(TABLE_KEY, device, plan.experts, plan.hidden, plan.intermediate,
                                       str(dtype).removeprefix("torch."), function, form, activation.interleaved,
                                       activation.limit, False)
    if device >= 0:
        routing.look_again()
    native = (device >= 0 and routing._native.get("namespace") == "cutlass_tune" and "moe_route" in routing._native
              and plan.experts <= routing.ROUTE_MAX_EXPERTS and ids_dtype in (torch.int64, torch.int32))
    if native:
        _route_op, _gather_op, _combine_op = (routing._native[name] for name in ("moe_route", "moe_gather",
                                                                                  "moe_combine"))
    return (TABLE_KEY, native, glu_runs, plan.experts, plan.transposed, function, form, activation.interleaved,
            activation.limit, activation.alpha)


ExpertsInterface.register(NAME, cutlass_tune_experts_forward)
