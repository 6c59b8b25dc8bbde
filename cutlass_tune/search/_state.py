"""What a sweep is told (its settings) and what it shows as it runs (its state, updated in place)."""

from __future__ import annotations

import dataclasses

import optuna

from ..space import KernelConfig, Problem


@dataclasses.dataclass(frozen=True)
class SweepSettings:
    trials: int = 48
    """Most configs compiled and measured in this store (earlier runs count)."""
    timeout_s: float | None = None
    sampler: str = "tpe"
    strategy: str | None = None
    """"prior" or "optuna" (`STRATEGIES`); None: prior for a `kernels: auto` space, else optuna."""
    batch: int = 8
    """Trials compiled together while the previous batch is measured."""
    seed: int = 0
    arch: str = "sm90a"


@dataclasses.dataclass
class ProblemProgress:
    problem: Problem
    study: optuna.Study
    cublas_tflops: float | None = None
    """cuBLAS measured before the current batch, on the first GPU still measuring (what the
    display shows)."""
    cublas_by_lane: dict[int, float | None] = dataclasses.field(default_factory=dict)
    """The same on each GPU (lane): the baseline of unpaired ratios taken there."""
    best_tflops: float | None = None
    best_config: KernelConfig | None = None
    best_at: int | None = None  # compile index at which the best was first reached
    best_ratio: float | None = None
    """Best TFLOP/s over the cuBLAS figure measured just before it (the ranking we report)."""
    measured: int = 0
    failed: int = 0


@dataclasses.dataclass
class SweepState:
    """What a progress display shows; updated in place as the sweep runs."""

    problems: list[ProblemProgress]
    compiled: int = 0
    invalid: int = 0
    queued: int = 0
    run_id: str = ""
    stop_reason: str = ""
    lost: list[str] = dataclasses.field(default_factory=list)
    """Why each GPU given up during the sweep was (the others measured what it left)."""
    elsewhere: int = 0
    """Configs this sweep proposed that another sweep on the store is measuring."""
