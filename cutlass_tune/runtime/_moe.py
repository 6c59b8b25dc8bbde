"""The MoE experts layer: token rows in, token outputs out, the two grouped GEMMs tuned and the
glue around them owned by the product.

    out[t] = sum_j w[t, j] * down_e(act(gate_up_e(x[t])))    e = top_k_index[t, j]

Steps (S = tokens x top_k routed rows, slot s = t * top_k + j):

1. Routing (`moe_routing`), on the device with no host sync: a stable sort of the S expert
   ids gives the permutation (routed row r holds slot perm[r]) and its inverse (slot s is routed
   row inv[s]); `searchsorted` of the sorted ids gives the grouped GEMM's int32 cumulative row
   ends (`offsets`). Every size is a function of the input shapes, so CUDA graphs capture it.
2. Gather (`moe_gather`): routed row inv[s] = x[s // top_k].
3. The gate_up grouped GEMM (`grouped_mm` through the table; torch's where it has no row).
4. The activation (`ExpertActivation`): act(gate) * up, GPT-OSS's clamped SwiGLU, or act(h) for
   non-gated experts, as torch computes them, in a pass of its own; or, the GLU stage
   (`_moe_glu.gate_up_glu`), steps 3 and 4 in one grouped kernel whose epilogue computes
   act(gate) * up ("silu+glu", on gate_up weights interleaved once), where the layer can run it:
   an unclamped act(gate) * up, no gate_up bias, 16-bit weights, a GLU row of this GPU in the
   table (`_moe_glu.glu_reason`), no gradient needed, `glu` on. Elsewhere the pass runs as
   before; which path a layer takes and why is logged once (INFO) and is `MoEExperts.glu_path`.
5. The down grouped GEMM, with no epilogue of its own.
6. Combine (`moe_combine`): out[t] = sum_j w[t, j] * y[inv[t * top_k + j]] in one deterministic
   pass (no atomics; fp32 accumulation).

The routing weights are applied in the combine, not as a per-row scale in the down GEMM's
epilogue. It is the same sum (w * y_row in fp32 either way, only the place of one rounding to
the row's type differs) and cheaper to build: the combine reads every routed row once anyway and
the product costs it nothing (it is memory-bound), while a row-scale epilogue needs a new node
rendered for the ptr-array kernels, tuned problems of its own, and a backward that still needs
the unscaled rows (d w[t, j] = <d out[t], y_row>), which the scaled output no longer holds.

Routing, gather and combine, their autograd and the native kernels that run them on CUDA where
the extension is built: `cutlass_tune.runtime._moe_routing`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from .. import settings
from .._torch import ACTIVATION_BY_NAME
from ..space import Activation
from ._dispatch import eager_direct_allowed, input_not_taken
from ._grouped import grouped_mm, torch_grouped_mm
from ._grouped_op import grouped_mm_op
from ._matmul import MatmulInputError
from ._moe_routing import MoERouting, moe_combine, moe_gather, moe_routing, slot_routing
from ._op import register_table, registered_table, table_key
from ._table import BestTable


class MoEInputError(MatmulInputError):
    """Tensors or arguments the experts layer cannot take (shapes, dtypes, devices, activation)."""


# ---------------------------------------------------------------------------------------------
# The activation between the two GEMMs


class GateForm(str, enum.Enum):
    """How the gate_up GEMM's output becomes the down GEMM's input."""

    NONE = "none"
    """act(h): non-gated experts (up_proj, I columns)."""
    GLU = "glu"
    """act(gate) * up (SwiGLU for silu), gate and up clamped first where `limit` is set."""
    SWIGLU_OAI = "swiglu_oai"
    """GPT-OSS: gate.clamp(max=limit) * sigmoid(alpha * gate) * (up.clamp(-limit, limit) + 1)."""


@dataclasses.dataclass(frozen=True)
class ExpertActivation:
    """The experts' activation: its function, its gate form and the gate's layout.

    Attributes:
        function: the element-wise function (of the gate for gated forms; SWIGLU_OAI's is silu's
            alpha form and takes no other).
        form: `GateForm`.
        interleaved: gate and up columns alternate (GPT-OSS's gate_up: gate = h[:, ::2], up =
            h[:, 1::2]); else the gate's I columns come first, then the up's (transformers' default).
        limit: gated forms: gate <= limit and -limit <= up <= limit before the product; None: no clamp.
        alpha: SWIGLU_OAI's sigmoid slope.
    """

    function: Activation = Activation.SILU
    form: GateForm = GateForm.GLU
    interleaved: bool = False
    limit: float | None = None
    alpha: float = 1.702

    @property
    def gated(self) -> bool:
        return self.form is not GateForm.NONE

    def problem(self) -> str | None:
        """Why these fields make no activation, or None."""
        if self.form is GateForm.NONE and (self.interleaved or self.limit is not None):
            return "a non-gated activation has no gate to interleave or clamp"
        if self.form is GateForm.SWIGLU_OAI and self.function is not Activation.SILU:
            return f"the GPT-OSS SwiGLU is silu's alpha form, not {self.function.value}"
        if self.function is Activation.NONE and self.form is not GateForm.SWIGLU_OAI:
            return "no function: name one (silu, gelu, gelu_tanh, relu)"
        return None

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """The activation of the gate_up GEMM's output `h` (S x N) as torch computes it: S x N/2
        gated, S x N otherwise."""
        return activate(h, self.function.value, self.form.value, self.interleaved, self.limit, self.alpha)


def activate(h: torch.Tensor, function: str, form: str, interleaved: bool, limit: float | None,
             alpha: float) -> torch.Tensor:
    """`ExpertActivation.__call__` on its fields' plain values (the names of `function` and
    `form`): what code torch.compile traces from plain values calls (the transformers experts'
    lean path), reading no dataclass field or enum member Dynamo would guard."""
    act = ACTIVATION_BY_NAME[function]
    if form == "none":  # GateForm.NONE's value (a literal: the member's `.value` guards the enum)
        return act(h)
    gate, up = (h[..., ::2], h[..., 1::2]) if interleaved else h.chunk(2, dim=-1)
    if limit is not None:
        gate = gate.clamp(min=None, max=limit)
        up = up.clamp(min=-limit, max=limit)
    if form == "swiglu_oai":  # GateForm.SWIGLU_OAI's
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))
    return act(gate) * up


SWIGLU_OAI = ExpertActivation(Activation.SILU, GateForm.SWIGLU_OAI, interleaved=True, limit=7.0, alpha=1.702)
"""GPT-OSS's experts' activation at its released configuration (swiglu_limit 7, alpha 1.702)."""

_NAMED: dict[str, ExpertActivation] = {
    **{a.value: ExpertActivation(a) for a in Activation if a is not Activation.NONE},
    "swiglu_oai": SWIGLU_OAI,
}


def expert_activation(activation: ExpertActivation | Activation | str, gated: bool) -> ExpertActivation:
    """The `ExpertActivation` an `activation` argument names: an `ExpertActivation` as it is; an
    `Activation` or its name ("silu", "gelu", "gelu_tanh", "relu") gated (act(gate) * up) or
    not as the weights' shapes say (`gated`); "swiglu_oai" GPT-OSS's. Raises MoEInputError."""
    if isinstance(activation, ExpertActivation):
        found = activation
    else:
        named = _NAMED.get(activation.value if isinstance(activation, Activation) else activation)
        if named is None:
            raise MoEInputError(f"activation {activation!r} is not one the experts layer computes (names: "
                                f"{', '.join(_NAMED)}; or an ExpertActivation)")
        found = named if named.form is GateForm.SWIGLU_OAI or gated else dataclasses.replace(named,
                                                                                             form=GateForm.NONE)
    why = found.problem()
    if why:
        raise MoEInputError(f"activation {found}: {why}")
    if found.gated != gated:
        raise MoEInputError(f"the {'gated' if found.gated else 'non-gated'} activation {found.form.value} needs "
                            f"{'twice' if found.gated else 'as many'} gate_up output features as down input "
                            "features")
    return found


# ---------------------------------------------------------------------------------------------
# The layer


def _grouped(x: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, key: str | None) -> torch.Tensor:
    """x's routed rows through their experts' b (E x K x N): the table's tuned grouped GEMM,
    torch's where the table has none (or `key` None). Eager inference calls the kernel without
    the operator's dispatch (`eager_direct_allowed`)."""
    if key is None:
        if x.dtype == torch.bfloat16 or not torch.compiler.is_compiling():
            return torch_grouped_mm(x, b, offs)
        # torch.compile traces torch's grouped GEMM for bfloat16 only; the operator on a table
        # of no rows computes the same with torch and traces for every dtype.
        key = _TORCH_ONLY
    if eager_direct_allowed(x, b):
        try:
            return grouped_mm(x, b, offs, table=registered_table(key))
        except MatmulInputError as err:
            input_not_taken("grouped_mm", err, "torch's grouped GEMM")
            return torch_grouped_mm(x, b, offs)
    return grouped_mm_op(x, b, offs, key)


_TORCH_ONLY = register_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})), key="cutlass_tune.moe.torch")
"""The key of a table of no rows: the grouped operator computes every call with torch."""


@dataclasses.dataclass(frozen=True)
class ExpertsLayout:
    """What the layer reads of its weights, checked once: E experts of hidden H and
    intermediate I, gate_up's output features N (2I gated, I not), nn.Linear-style stacks
    (E x N x H, E x H x I) or, `transposed`, E x H x N and E x I x H."""

    experts: int
    hidden: int
    intermediate: int
    activation: ExpertActivation
    transposed: bool


def experts_layout(gate_up: torch.Tensor, down: torch.Tensor, activation: ExpertActivation | Activation | str,
                   transposed: bool, gate_up_bias: torch.Tensor | None = None,
                   down_bias: torch.Tensor | None = None) -> ExpertsLayout:
    """The layout of an experts layer's weights. Raises MoEInputError with what to fix."""
    for name, t in (("gate_up", gate_up), ("down", down)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            got = f"{t.dim()}-D" if isinstance(t, torch.Tensor) else type(t).__name__
            raise MoEInputError(f"{name} must be a 3-D tensor (one matrix per expert), not {got}")
    e, n, h = gate_up.shape if not transposed else (gate_up.shape[0], gate_up.shape[2], gate_up.shape[1])
    ed, hd, i = down.shape if not transposed else (down.shape[0], down.shape[2], down.shape[1])
    form = "E x H x N and E x I x H" if transposed else "E x N x H and E x H x I"
    if e != ed or h != hd or n not in (i, 2 * i):
        raise MoEInputError(f"gate_up {tuple(gate_up.shape)} and down {tuple(down.shape)} are not one experts layer "
                            f"({form}, N = 2I gated or I)")
    if gate_up.dtype != down.dtype or gate_up.device != down.device:
        raise MoEInputError(f"gate_up ({gate_up.dtype}, {gate_up.device}) and down ({down.dtype}, {down.device}) "
                            "must share dtype and device")
    for name, bias, width in (("gate_up_bias", gate_up_bias, n), ("down_bias", down_bias, h)):
        if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (e, width)):
            shape = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise MoEInputError(f"{name} must be {e} x {width} (one vector per expert), not {shape}")
    return ExpertsLayout(e, h, i, expert_activation(activation, n == 2 * i), transposed)


def _check_call(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                layout: ExpertsLayout, device: torch.device) -> None:
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2 or hidden.shape[1] != layout.hidden:
        got = tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else type(hidden).__name__
        raise MoEInputError(f"hidden must be tokens x {layout.hidden}, not {got}")
    tokens = hidden.shape[0]
    if top_k_index.dim() != 2 or top_k_index.shape[0] != tokens or top_k_index.dtype.is_floating_point:
        raise MoEInputError(f"top_k_index must be {tokens} x top_k integer expert ids, not {top_k_index.dtype} of "
                            f"shape {tuple(top_k_index.shape)}")
    if tuple(top_k_weights.shape) != tuple(top_k_index.shape) or not top_k_weights.dtype.is_floating_point:
        raise MoEInputError(f"top_k_weights must be floating {tuple(top_k_index.shape)} like top_k_index, not "
                            f"{top_k_weights.dtype} of shape {tuple(top_k_weights.shape)}")
    for name, t in (("hidden", hidden), ("top_k_index", top_k_index), ("top_k_weights", top_k_weights)):
        if t.device != device:
            raise MoEInputError(f"{name} is on {t.device} and the experts' weights on {device}")


class MoEDecode(str, enum.Enum):
    """How the layer runs its two GEMMs: the tuned grouped GEMMs over routed rows, or one
    batched GEMM of each routed row against its own expert's weights (torch's `bmm` over the
    gathered experts' weights, as transformers' "batched_mm" experts run at decode)."""

    AUTO = "auto"
    """Batched where tokens x top_k is at most `settings.moe_batched_rows()` (a measured
    threshold; 0, the default, is never), else grouped."""
    GROUPED = "grouped"
    BATCHED = "batched"


def moe_decode(decode: MoEDecode | str) -> MoEDecode:
    """The `MoEDecode` a `decode` argument names. Raises MoEInputError."""
    try:
        return MoEDecode(decode)
    except ValueError:
        raise MoEInputError(f"decode {decode!r} is not one of {', '.join(d.value for d in MoEDecode)}") from None


def runs_batched(decode: MoEDecode, routed_rows: int) -> bool:
    """Whether a call of `routed_rows` (tokens x top_k, a shape: no host sync, and a guard
    under torch.compile) runs the batched GEMMs. Under torch.compile the threshold is read when
    the layer is traced, and the environment is not guarded (guards on `os.environ` cost every
    call of the compiled layer host time)."""
    # Compared by value: reaching MoEDecode.AUTO as well as the caller's `decode` makes Dynamo
    # guard the two are one object, a guard in Python on every call.
    if decode == "auto":
        return routed_rows <= _batched_rows()
    return decode == "batched"


@torch.compiler.assume_constant_result
def _batched_rows() -> int:
    return settings.moe_batched_rows()


def _bmm(rows: torch.Tensor, weights: torch.Tensor, transposed: bool) -> torch.Tensor:
    """Each row through its own matrix: S x K rows, S x N x K matrices (S x K x N `transposed`)."""
    if transposed:
        return torch.bmm(rows.unsqueeze(1), weights).squeeze(1)
    return torch.bmm(weights, rows.unsqueeze(-1)).squeeze(-1)


def experts_forward(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                    gate_up: torch.Tensor, down: torch.Tensor, layout: ExpertsLayout, key: str | None, *,
                    gate_up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None,
                    expert_parallel: bool = False, post: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    decode: MoEDecode = MoEDecode.AUTO, glu: bool = True) -> torch.Tensor:
    """The layer on checked operands (`moe_experts`'s steps); `post` runs on the down GEMM's
    rows before the combine (transformers' post-expert norm); `glu`: the GLU stage where it can
    run (`runs_glu`)."""
    num_experts = layout.experts
    if runs_batched(decode, top_k_index.numel()):
        return _batched_forward(hidden, top_k_index, top_k_weights, gate_up, down, layout, gate_up_bias=gate_up_bias,
                                down_bias=down_bias, expert_parallel=expert_parallel, post=post)
    routing = moe_routing(top_k_index, num_experts)
    rows = moe_gather(hidden.to(gate_up.dtype), routing)
    ids = routing.sorted_ids
    sentinel = None
    if expert_parallel:
        # Another rank's experts (ids of num_experts or more) sort past offsets[-1], where the
        # GEMMs write nothing: their rows are zeroed as transformers does, and their bias reads clamped.
        sentinel = (ids >= num_experts).unsqueeze(-1)
        ids = ids.clamp(max=num_experts - 1)
        rows = rows.masked_fill(sentinel, 0.0)
    if glu and key is not None and runs_glu(layout, gate_up, key, gate_up_bias, hidden, down, down_bias,
                                             top_k_weights):
        h = _moe_glu.gate_up_glu(rows, gate_up, routing.offsets, key, layout)
        if sentinel is not None:  # act(0) * 0 = 0: as the unfused path's zeroed rows give
            h = h.masked_fill(sentinel, 0.0)
    else:
        first = gate_up if layout.transposed else gate_up.transpose(-2, -1)
        h = _grouped(rows, first, routing.offsets, key)
        if gate_up_bias is not None:
            h = h + gate_up_bias.index_select(0, ids)
        if sentinel is not None:
            h = h.masked_fill(sentinel, 0.0)
        h = layout.activation(h)
    second = down if layout.transposed else down.transpose(-2, -1)
    y = _grouped(h.to(down.dtype), second, routing.offsets, key)
    return _combined(y, ids, sentinel, routing, hidden, top_k_index, top_k_weights, down_bias=down_bias, post=post)


def runs_glu(layout: ExpertsLayout, gate_up: torch.Tensor, key: str, gate_up_bias: torch.Tensor | None,
             *tensors: torch.Tensor | None) -> bool:
    """Whether a grouped call of the layer runs the GLU stage: the layer can
    (`_moe_glu.glu_reason`) and no gradient is needed (the GLU kernel keeps neither gate nor up
    for a backward: under autograd the GEMM and the activation run apart, as before)."""
    if torch.is_grad_enabled():
        for t in (gate_up, gate_up_bias, *tensors):
            if t is not None and t.requires_grad:
                return False
    return not _moe_glu.glu_reason(layout, gate_up, key, gate_up_bias)


def _combined(y: torch.Tensor, ids: torch.Tensor, sentinel: torch.Tensor | None, routing: MoERouting,
              hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, *,
              down_bias: torch.Tensor | None,
              post: Callable[[torch.Tensor], torch.Tensor] | None) -> torch.Tensor:
    """Both paths' end: the down GEMM's rows (y, one per slot of `routing`'s order, experts
    `ids`) with their bias, another rank's rows zeroed, `post`, then combined back to tokens.

    Without `post` the bias is not added to the rows: sum_j w_j (y_j + b_e(j)) is the combine of
    the rows plus sum_j w_j b_e(j), a tokens x experts by experts x hidden product of the routing
    weights scattered per expert and the bias. Adding it to the rows is a pass over all routed
    rows (S x hidden written and read again: 0.07 ms of a 1.9 ms GPT-OSS layer at 4096 tokens,
    its combine 0.12 ms against torch's fused 0.05); the product reads the weights and the bias."""
    weights = top_k_weights.reshape(-1, top_k_weights.shape[-1]).float()
    bias_term = None
    if down_bias is not None and post is None:
        slot_ids = top_k_index.reshape(weights.shape)
        experts = down_bias.shape[0]
        if sentinel is not None:  # another rank's slots add nothing (their rows are zeroed below)
            weights_here = weights.masked_fill(slot_ids >= experts, 0.0)
            slot_ids = slot_ids.clamp(max=experts - 1)
        else:
            weights_here = weights
        per_expert = weights.new_zeros(weights.shape[0], experts).scatter_add(1, slot_ids, weights_here)
        # In the bias's type: a float32 product of bf16 weights runs cuBLAS's SIMT kernel (34 us
        # a GPT-OSS layer at 4096 tokens on an H200), the tensor cores' in bf16 a few; torch's own
        # path adds the bias to bf16 rows before weighting them, no finer than this.
        bias_term = (per_expert.to(down_bias.dtype) @ down_bias).float()
    elif down_bias is not None:
        y = y + down_bias.index_select(0, ids)
    if sentinel is not None:
        y = y.masked_fill(sentinel, 0.0)
    if post is not None:
        y = post(y)
    out = moe_combine(y, routing, weights)
    return out.to(hidden.dtype) if bias_term is None else (out.float() + bias_term).to(hidden.dtype)


def _batched_forward(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                     gate_up: torch.Tensor, down: torch.Tensor, layout: ExpertsLayout, *,
                     gate_up_bias: torch.Tensor | None, down_bias: torch.Tensor | None, expert_parallel: bool,
                     post: Callable[[torch.Tensor], torch.Tensor] | None) -> torch.Tensor:
    """The layer with batched GEMMs: slot s's row x[s // top_k] against its expert's own copy of
    the weights (S x N x H gathered, as transformers' "batched_mm" does; no sort, no offsets),
    then the same activation and combine as the grouped path."""
    num_experts, top_k = layout.experts, top_k_index.shape[-1]
    ids = top_k_index.reshape(-1)
    sentinel = None
    if expert_parallel:
        sentinel = (ids >= num_experts).unsqueeze(-1)
        ids = ids.clamp(max=num_experts - 1)
    rows = hidden.to(gate_up.dtype).repeat_interleave(top_k, dim=0)
    h = _bmm(rows, gate_up.index_select(0, ids), layout.transposed)
    if gate_up_bias is not None:
        h = h + gate_up_bias.index_select(0, ids)
    h = layout.activation(h)
    y = _bmm(h.to(down.dtype), down.index_select(0, ids), layout.transposed)
    return _combined(y, ids, sentinel, slot_routing(top_k_index), hidden, top_k_index, top_k_weights,
                     down_bias=down_bias, post=post)


def moe_experts(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                gate_up: torch.Tensor, down: torch.Tensor, *, table: BestTable | str | Path | None,
                activation: ExpertActivation | Activation | str = "silu", gate_up_bias: torch.Tensor | None = None,
                down_bias: torch.Tensor | None = None, transposed: bool = False,
                expert_parallel: bool = False, decode: MoEDecode | str = "auto", glu: bool = True) -> torch.Tensor:
    """A MoE experts layer: out[t] = sum_j w[t, j] * down_e(act(gate_up_e(hidden[t]) + b1_e)) + b2_e
    (e = top_k_index[t, j], w = top_k_weights), as transformers' experts compute it, with both
    grouped GEMMs run by the table's tuned kernels (torch's grouped GEMM where the table has no
    row for a shape, one warning per cause) and the routing, gather and combine on the device
    with no host sync (see the module docstring for the steps).

    CUDA-graph safe, traced by torch.compile with no graph break (pass a registered key as
    `table` there), differentiable in hidden, the weights, the biases and top_k_weights.
    Deterministic: the same inputs give the same bits.

    Args:
        hidden: tokens x H.
        top_k_index: tokens x top_k expert ids in [0, E) (E or more only with `expert_parallel`).
        top_k_weights: tokens x top_k routing weights (any floating type; applied in fp32).
        gate_up: E x N x H (nn.Linear-style; transformers' gate_up_proj, or up_proj for
            non-gated experts), N = 2I gated (gate columns first, or alternating for an
            interleaved activation) or I; E x H x N with `transposed`.
        down: E x H x I (E x I x H with `transposed`), gate_up's dtype and device.
        table: a `BestTable`, what `BestTable.load` reads, or a key from `register_table`;
            None: torch's grouped GEMM.
        activation: an `ExpertActivation`, or a name: "silu", "gelu", "gelu_tanh", "relu"
            (act(gate) * up for gated weights, act(h) otherwise), "swiglu_oai" (GPT-OSS's
            clamped SwiGLU, interleaved, limit 7, alpha 1.702).
        gate_up_bias: E x N, added to the gate_up GEMM's rows before the activation.
        down_bias: E x H, added to the down GEMM's rows before the routing weights.
        transposed: the weight stacks are E x in x out (transformers' `is_transposed`).
        expert_parallel: ids of E or more are other ranks' experts: their rows contribute zero
            (transformers' expert-parallel sentinels).
        decode: "grouped": the grouped GEMMs; "batched": one `bmm` of each routed row against
            its expert's gathered weights (transformers' "batched_mm"; for a few tokens);
            "auto": batched up to `CUTLASS_TUNE_MOE_BATCHED_ROWS` routed rows (tokens x top_k,
            a shape: CUDA graphs and torch.compile take either), grouped above.
        glu: the grouped path's GLU stage where it can run (act(gate) * up in the gate_up
            GEMM's epilogue: an unclamped gated activation, no gate_up bias, 16-bit weights, a
            GLU row of this GPU in the table, no gradient needed; gate_up interleaved once per
            weight and version: one more E x 2I x H copy of the weights, made only where the
            table has the GLU row); False: the GEMM and the activation pass apart. On by default:
            on an H200 at Qwen3-235B's widths, 4096 tokens compiled, a GLU kernel swept on the
            layer's uniform routing took the layer from 3.01 to 2.72 ms (benchmarks/moe_glu.md).

    Returns:
        tokens x H of hidden's dtype.

    Raises:
        MoEInputError: weights that are not one experts layer, biases, routing or hidden of the
            wrong shape, mixed devices, an activation the layer does not compute or one the
            weights' shapes contradict, a `decode` that names no path.
    """
    layout = experts_layout(gate_up, down, activation, transposed, gate_up_bias, down_bias)
    _check_call(hidden, top_k_index, top_k_weights, layout, gate_up.device)
    key = None if table is None else table_key(table)
    return experts_forward(hidden, top_k_index, top_k_weights, gate_up, down, layout, key,
                           gate_up_bias=gate_up_bias, down_bias=down_bias, expert_parallel=expert_parallel,
                           decode=moe_decode(decode), glu=glu)


class MoEExperts(torch.nn.Module):
    """A MoE experts layer as a module: `moe_experts` on the weight stacks it holds.

    Built from weight stacks (`MoEExperts(gate_up, down, table=...)`, parameters of their own
    unless given as Parameters) or from a transformers experts module (`from_experts`, sharing
    its parameters). `forward(hidden, top_k_index, top_k_weights)`; state_dict keys gate_up,
    down, gate_up_bias, down_bias (the GLU stage's interleaved weights are no state: kept beside
    the weight, `_moe_glu.glu_weights`). `glu_path` (and the repr) says whether its grouped
    calls run the GLU stage and why not.
    """

    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor, *, table: BestTable | str | Path | None,
                 activation: ExpertActivation | Activation | str = "silu", gate_up_bias: torch.Tensor | None = None,
                 down_bias: torch.Tensor | None = None, transposed: bool = False,
                 expert_parallel: bool = False, decode: MoEDecode | str = "auto", glu: bool = True) -> None:
        super().__init__()
        self.glu = glu
        self.layout = experts_layout(gate_up, down, activation, transposed, gate_up_bias, down_bias)
        self.decode = moe_decode(decode)
        self.table_key = None if table is None else table_key(table)
        self.expert_parallel = expert_parallel
        self.gate_up = _parameter(gate_up)
        self.down = _parameter(down)
        self.gate_up_bias = None if gate_up_bias is None else _parameter(gate_up_bias)
        self.down_bias = None if down_bias is None else _parameter(down_bias)

    @classmethod
    def from_experts(cls, experts: Any, table: BestTable | str | Path | None,
                     decode: MoEDecode | str = "auto", glu: bool = True) -> MoEExperts:
        """The layer of a transformers (>= 5) experts module, sharing its parameters.

        Raises:
            MoEInputError: experts whose activation or layout the layer does not compute (the
                reason names it).
        """
        from ._moe_gates import experts_plan

        plan = experts_plan(experts)
        if isinstance(plan, str):
            raise MoEInputError(plan)
        gate_up = experts.gate_up_proj if experts.has_gate else experts.up_proj
        bias = getattr(experts, "gate_up_proj_bias" if experts.has_gate else "up_proj_bias", None)
        return cls(gate_up, experts.down_proj, table=table, activation=plan.activation,
                   gate_up_bias=bias if experts.has_bias else None,
                   down_bias=experts.down_proj_bias if experts.has_bias else None,
                   transposed=experts.is_transposed, expert_parallel=getattr(experts, "_is_expert_parallel", False),
                   decode=decode, glu=glu)

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        """`moe_experts` on the module's weights. Raises MoEInputError for hidden or routing
        of the wrong shape or device."""
        _check_call(hidden, top_k_index, top_k_weights, self.layout, self.gate_up.device)
        return experts_forward(hidden, top_k_index, top_k_weights, self.gate_up, self.down, self.layout,
                               self.table_key, gate_up_bias=self.gate_up_bias, down_bias=self.down_bias,
                               expert_parallel=self.expert_parallel, decode=self.decode, glu=self.glu)

    @property
    def glu_path(self) -> str:
        """Which path the grouped calls' gate_up and activation take: "glu" (one GLU kernel),
        or "unfused: " and why (gradients needed counts only inside a call)."""
        if not self.glu:
            return "unfused: glu off"
        if self.table_key is None:
            return "unfused: no table"
        why = _moe_glu.glu_reason(self.layout, self.gate_up, self.table_key, self.gate_up_bias)
        return f"unfused: {why}" if why else "glu"

    def extra_repr(self) -> str:
        layout = self.layout
        return (f"experts={layout.experts}, hidden={layout.hidden}, intermediate={layout.intermediate}, "
                f"activation={layout.activation}, transposed={layout.transposed}, table={self.table_key!r}, "
                f"decode={self.decode.value}, glu={self.glu_path!r}")


def _parameter(t: torch.Tensor) -> torch.nn.Parameter:
    return t if isinstance(t, torch.nn.Parameter) else torch.nn.Parameter(t, requires_grad=t.is_floating_point())



# Last: the GLU stage's module reads this one's types (a module object, so either may be imported first).
from . import _moe_glu  # noqa: E402

__all__ = ["ExpertActivation", "ExpertsLayout", "GateForm", "MoEDecode", "MoEExperts", "MoEInputError", "MoERouting",
           "SWIGLU_OAI", "moe_combine", "moe_experts", "moe_gather", "moe_routing"]
