"""The compile-time knobs of a search space as Optuna parameters, and back.

Each knob (`KernelConfig.knobs`) is one categorical parameter of its name whose choices are the
values the space file lists (the union over its `kernels` products), each the string its kind
writes (`Kind.text`), so Optuna stores and shows them plainly; the mapping back to a
`KernelConfig` goes through the validated enums. A knob that does not apply to a problem's
configs (fp8 fast accumulation for 16-bit inputs) is no parameter of its study, and knobs
declared without `parameter_at_default` (added after studies were made) become parameters only
in spaces that list a value other than their default, so older studies keep their parameters.
In a `kernels: auto` space the choices are the values some valid config holds (with "auto"
beside them for a knob that has it), and membership is asked of the space, never listed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna

from ..space import AutoKernels, KernelConfig, Operation, Problem, SearchSpace

KNOBS = tuple(k.name for k in KernelConfig.knobs)
_ONLY_AT_DEFAULT = {k.name: k.kind.text(k.default) for k in KernelConfig.knobs if not k.parameter_at_default}
"""Knobs left out of a study whose space lists only this value for them."""


@dataclasses.dataclass(frozen=True)
class ParamSpace:
    """Choices per knob, and the configs of the file (for membership)."""

    choices: dict[str, tuple[str, ...]]
    members: frozenset[str]  # KernelConfig.hash of every candidate the file describes
    auto: AutoKernels | None = None
    """`kernels: auto`: the configs of the problem's kind (`members` is then empty)."""

    @classmethod
    def from_space(cls, space: SearchSpace, problem: Problem) -> ParamSpace:
        """Parameters for the candidates of `space` of `problem`'s operation."""
        auto = space.auto_for(problem)
        if auto is not None:
            return cls(_auto_choices(auto), frozenset(), auto)
        operation = problem.operation
        configs = [c for c in space.candidates if c.operation == operation]
        choices: dict[str, list[str]] = {k: [] for k in KNOBS}
        for c in configs:
            for knob, value in params_of(c).items():
                if value not in choices[knob]:
                    choices[knob].append(value)
        kept = {k: tuple(v) for k, v in choices.items() if v and v != [_ONLY_AT_DEFAULT.get(k)]}
        return cls(kept, frozenset(c.hash for c in configs))

    def has(self, cfg: KernelConfig) -> bool:
        """Whether `cfg` is one of the space's configs of this kind (in `kernels: auto`, a valid one)."""
        return cfg in self.auto if self.auto is not None else cfg.hash in self.members

    def params(self, cfg: KernelConfig) -> dict[str, str]:
        """`params_of(cfg)` restricted to this space's parameters."""
        return {k: v for k, v in params_of(cfg).items() if k in self.choices}

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return {k: optuna.distributions.CategoricalDistribution(v) for k, v in self.choices.items()}

    def grid(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in self.choices.items()}


def _auto_choices(auto: AutoKernels) -> dict[str, tuple[str, ...]]:
    out = {}
    for knob in KernelConfig.knobs:
        if not knob.applies_to(KernelConfig.for_operation(auto.operation)):
            continue
        values = auto.values_in_valid()[knob.name]
        texts = (["auto"] if knob.auto is not None else []) + [knob.kind.text(v) for v in values]
        if texts != [_ONLY_AT_DEFAULT.get(knob.name)]:
            out[knob.name] = tuple(dict.fromkeys(texts))
    return out


def params_of(cfg: KernelConfig) -> dict[str, str]:
    """Optuna parameters of a config: each knob that applies to it, as text. The epilogue is
    "auto" when it is the schedule's pair."""
    return {k.name: k.text(cfg) for k in cfg.knobs if k.applies_to(cfg)}


def config_of(params: dict[str, Any], operation: Operation) -> KernelConfig:
    """The config of `operation` (a problem's) for Optuna parameters (as produced by
    `params_of`, or `ParamSpace.params`: a missing knob takes its default)."""
    return KernelConfig.from_knobs(
        {k.name: k.kind.read(params[k.name]) for k in KernelConfig.knobs if k.name in params}, operation.operation)
