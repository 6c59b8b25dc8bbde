"""The compile-time knobs of a search space as Optuna parameters, and back.

Each knob is one categorical parameter whose choices are the values the space file lists
(the union over its `kernels` products). Every choice is a string, so Optuna stores and shows
them plainly, and the mapping back to a `KernelConfig` goes through the validated enums.
Knobs added later (the epilogue tile and source) become parameters only in spaces that list a
value other than their default, so studies made before them keep their parameters.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna

from ..space import (
    AUTO_EPILOGUE_TILE,
    AUTO_STAGES,
    EpilogueSchedule,
    KernelConfig,
    KernelSchedule,
    Problem,
    SearchSpace,
    TileScheduler,
)
from ..space._spec import _EPILOGUE_AUTO

KNOBS = ("tile_m", "tile_n", "tile_k", "cluster", "stages", "kernel_schedule",
         "epilogue_schedule", "tile_scheduler", "fp8_fast_accum", "epilogue_tile_n",
         "epilogue_source")
_OPTIONAL_DEFAULTS = {"epilogue_tile_n": "auto", "epilogue_source": "true"}
"""Knobs left out of a study whose space lists only this value for them."""


def _stages_label(v: int) -> str:
    return "auto" if v == AUTO_STAGES else str(v)


@dataclasses.dataclass(frozen=True)
class ParamSpace:
    """Choices per knob, and the configs of the file (for membership)."""

    choices: dict[str, tuple[str, ...]]
    members: frozenset[str]  # KernelConfig.hash of every candidate the file describes

    @classmethod
    def from_space(cls, space: SearchSpace, problem: Problem) -> ParamSpace:
        """Parameters for the candidates of `space` that match `problem`'s types and layouts."""
        configs = [c for c in space.candidates if _matches(c, problem)]
        choices: dict[str, list[str]] = {k: [] for k in KNOBS}
        for c in configs:
            for knob, value in params_of(c).items():
                if value not in choices[knob]:
                    choices[knob].append(value)
        # fp8_fast_accum exists only for fp8 problems: 16-bit studies keep their parameters.
        kept = {k: tuple(v) for k, v in choices.items()
                if v and v != [_OPTIONAL_DEFAULTS.get(k)]}
        return cls(kept, frozenset(c.hash for c in configs))

    def params(self, cfg: KernelConfig) -> dict[str, str]:
        """`params_of(cfg)` restricted to this space's parameters."""
        return {k: v for k, v in params_of(cfg).items() if k in self.choices}

    def distributions(self) -> dict[str, optuna.distributions.CategoricalDistribution]:
        return {k: optuna.distributions.CategoricalDistribution(v) for k, v in self.choices.items()}

    def grid(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in self.choices.items()}


def _matches(cfg: KernelConfig, problem: Problem) -> bool:
    return (cfg.dtype_a, cfg.dtype_b, cfg.dtype_d, cfg.layout_a, cfg.layout_b) == (
        problem.dtype_a, problem.dtype_b, problem.dtype_d, problem.layout_a, problem.layout_b)


def params_of(cfg: KernelConfig) -> dict[str, str]:
    """Optuna parameters of a config. The epilogue is "auto" when it is the schedule's pair."""
    epilogue = ("auto" if cfg.epilogue_schedule is _EPILOGUE_AUTO[cfg.kernel_schedule]
                else cfg.epilogue_schedule.value)
    params = {
        "tile_m": str(cfg.tile_m), "tile_n": str(cfg.tile_n), "tile_k": str(cfg.tile_k),
        "cluster": f"{cfg.cluster_m}x{cfg.cluster_n}", "stages": _stages_label(cfg.stages),
        "kernel_schedule": cfg.kernel_schedule.value, "epilogue_schedule": epilogue,
        "tile_scheduler": cfg.tile_scheduler.value,
        "epilogue_tile_n": ("auto" if cfg.epilogue_tile_n == AUTO_EPILOGUE_TILE
                            else str(cfg.epilogue_tile_n)),
        "epilogue_source": "true" if cfg.epilogue_source else "false",
    }
    if cfg.dtype_a.is_fp8 and cfg.dtype_b.is_fp8:
        params["fp8_fast_accum"] = "true" if cfg.fp8_fast_accum else "false"
    return params


def config_of(params: dict[str, Any], problem: Problem) -> KernelConfig:
    """The config for Optuna parameters (as produced by `params_of`, or `ParamSpace.params`:
    a missing optional knob takes its default) on `problem`'s types."""
    schedule = KernelSchedule(params["kernel_schedule"])
    epilogue = params["epilogue_schedule"]
    cluster_m, cluster_n = (int(x) for x in params["cluster"].split("x"))
    return KernelConfig(
        dtype_a=problem.dtype_a, dtype_b=problem.dtype_b, dtype_c=problem.dtype_d,
        dtype_d=problem.dtype_d, layout_a=problem.layout_a, layout_b=problem.layout_b,
        tile_m=int(params["tile_m"]), tile_n=int(params["tile_n"]), tile_k=int(params["tile_k"]),
        cluster_m=cluster_m, cluster_n=cluster_n,
        stages=AUTO_STAGES if params["stages"] == "auto" else int(params["stages"]),
        kernel_schedule=schedule,
        epilogue_schedule=_EPILOGUE_AUTO[schedule] if epilogue == "auto" else EpilogueSchedule(epilogue),
        tile_scheduler=TileScheduler(params["tile_scheduler"]),
        fp8_fast_accum=params.get("fp8_fast_accum") == "true",
        epilogue_tile_n=(AUTO_EPILOGUE_TILE if params.get("epilogue_tile_n", "auto") == "auto"
                         else int(params["epilogue_tile_n"])),
        epilogue_source=params.get("epilogue_source", "true") == "true",
    )
