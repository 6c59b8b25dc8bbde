"""Which transformers (>= 5) experts modules the MoE experts layer computes, read from their
class and attributes alone (torch.compile traces it) and checked once on a probe in eager code.

A transformers experts module (`use_experts_implementation`) holds gate_up_proj (or up_proj for
non-gated experts), down_proj, optional biases, `has_gate`, `has_bias`, `is_transposed`,
`has_post_expert_norm`, and its gate as `_apply_gate` (transformers' default act(gate) * up, or a
family's own: GPT-OSS's clamped SwiGLU on interleaved columns, clamped SwiGLUs of others). This
module names the gates the layer computes (`_GATES`) without importing transformers.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from ..space import Activation
from ._moe import ExpertActivation, ExpertsLayout, GateForm, MoEInputError, experts_layout
from ._patch import activation_of_module


@dataclasses.dataclass(frozen=True)
class _Gate:
    """A transformers `_apply_gate` the layer computes: its form and layout, where its
    activation comes from (the module's `act_fn`, or `function`), and the module's attributes
    holding its clamp limit and alpha."""

    form: GateForm
    interleaved: bool = False
    function: Activation | None = None
    limit: str | None = None
    alpha: str | None = None


_GATES: dict[str, _Gate] = {
    "transformers.integrations.moe._default_apply_gate": _Gate(GateForm.GLU),
    "transformers.models.gpt_oss.modeling_gpt_oss.GptOssExperts._apply_gate":
        _Gate(GateForm.SWIGLU_OAI, interleaved=True, function=Activation.SILU, limit="limit", alpha="alpha"),
    "transformers.models.openai_privacy_filter.modeling_openai_privacy_filter.OpenAIPrivacyFilterExperts._apply_gate":
        _Gate(GateForm.SWIGLU_OAI, function=Activation.SILU, limit="limit", alpha="alpha"),
    "transformers.models.minimax_m3_vl.modeling_minimax_m3_vl.MiniMaxM3VLExperts._apply_gate":
        _Gate(GateForm.SWIGLU_OAI, function=Activation.SILU, limit="swiglu_limit", alpha="swiglu_alpha"),
    "transformers.models.deepseek_v4.modeling_deepseek_v4.DeepseekV4Experts._apply_gate":
        _Gate(GateForm.GLU, limit="limit"),
    **{f"transformers.models.{name}.modeling_{name}.{cls}._apply_gate":
       _Gate(GateForm.GLU, function=Activation.SILU, limit="swiglu_limit")
       for name, cls in (("hy_v4", "HYV4Experts"), ("hy_v4_vl", "HYV4VLExperts"),
                         ("glm5_next", "Glm5NextTextExperts"))},
}
"""The gates of transformers' experts the layer computes, by their function's qualified name.
Each is checked against the module's own gate once, on its first eager call (`_probe`)."""


def _gate_name(cls: type) -> str:
    """The qualified name of an experts class's `_apply_gate`."""
    fn = getattr(cls, "_apply_gate", None)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


_traced_gate_name = torch.compiler.assume_constant_result(_gate_name)
"""`_gate_name` computed by Python while torch.compile traces (a constant of the graph): traced,
Dynamo formats a function's `__qualname__` as "<attribute '__qualname__' of 'function'
objects>" (torch 2.13), which names no gate, and every experts module compiled before its first
eager call ran transformers' torch glue."""


def experts_activation(experts: Any) -> ExpertActivation | str:
    """The `ExpertActivation` of a transformers experts module, or why the layer does not
    compute it (read from its class and attributes alone: torch.compile traces it)."""
    if not getattr(experts, "has_gate", True):
        function = activation_of_module(getattr(experts, "act_fn", None))
        if function is None or function is Activation.NONE:
            return f"its activation {type(getattr(experts, 'act_fn', None)).__name__} is not one the layer computes"
        return ExpertActivation(function, GateForm.NONE)
    name = (_traced_gate_name if torch.compiler.is_compiling() else _gate_name)(type(experts))
    gate = _GATES.get(name)
    if gate is None:
        return f"its gate {name} is not one the layer computes"
    function = gate.function or activation_of_module(getattr(experts, "act_fn", None))
    if function is None or function is Activation.NONE:
        return f"its activation {type(getattr(experts, 'act_fn', None)).__name__} is not one the layer computes"
    limit = getattr(experts, gate.limit) if gate.limit else None
    alpha = getattr(experts, gate.alpha) if gate.alpha else ExpertActivation.alpha
    return ExpertActivation(function, gate.form, gate.interleaved, None if limit is None else float(limit),
                            float(alpha))


def _probe(experts: Any, activation: ExpertActivation) -> str | None:
    """Why the module's own gate (or activation) computes otherwise than `activation`, on values
    past its clamps, in float32; None where they agree."""
    generator = torch.Generator().manual_seed(0)
    span = 3 * (activation.limit if activation.limit is not None and math.isfinite(activation.limit) else 4.0)
    probe = (torch.rand(16, 64, generator=generator) * 2 - 1) * span
    with torch.no_grad():
        try:
            theirs = experts._apply_gate(probe) if activation.gated else experts.act_fn(probe)
        except Exception as err:  # a gate that cannot run on a CPU probe is not one we can check
            return f"its gate could not be checked on a probe ({type(err).__name__})"
        ours = activation(probe)
    if theirs.shape != ours.shape or not torch.allclose(theirs.float(), ours, rtol=1e-5, atol=1e-5):
        return f"its gate computes otherwise than the layer's {activation}"
    return None


def experts_plan(experts: Any) -> ExpertsLayout | str:
    """What the "cutlass_tune" experts run for a transformers experts module: the layout of the
    fused layer (`cutlass_tune.moe_experts`), or why the module runs transformers' torch glue
    around the tuned GEMMs instead (`glue_forward`). Checked once per module in eager code (its
    gate against the layer's on a probe) and kept on the module."""
    plan = getattr(experts, _PLAN, None)
    if plan is not None:
        return plan
    activation = experts_activation(experts)
    if isinstance(activation, str):
        plan = activation
    else:
        try:
            plan = experts_layout(experts.gate_up_proj if experts.has_gate else experts.up_proj, experts.down_proj,
                                  activation, experts.is_transposed)
        except MoEInputError as err:
            plan = str(err)
    if torch.compiler.is_compiling():
        return plan
    if not isinstance(plan, str):
        plan = _probe(experts, plan.activation) or plan
    if isinstance(plan, str):
        plan = f"{type(experts).__name__}: {plan}"
    setattr(experts, _PLAN, plan)
    return plan


_PLAN = "_cutlass_tune_plan"
