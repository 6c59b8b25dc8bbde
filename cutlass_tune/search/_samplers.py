"""Optuna samplers by name, all taught about invalid configs through constraints.

Invalid configs never reach nvcc. Their trials are pruned, without a value (and with the
constraint `invalid` set to 1), so TPE ranks them below every complete trial and learns
where the invalid region lies, while tools that read complete trials only (optuna-dashboard's
history, parameter importances) never see them as 0 TFLOP/s; GP, random and grid sampling
move on (the strategy tells an invalid proposal at once, without compiling). Studies written
before kept such trials complete with value 0; they resume as they are.
"""

from __future__ import annotations

import optuna

from ..store import STUDY_CONSTRAINT, STUDY_METRIC

SAMPLERS = ("tpe", "gp", "random", "grid")
CONSTRAINT = STUDY_CONSTRAINT
"""Constraint name: 1 for an invalid config (infeasible), 0 for a valid one (the store's name)."""
METRIC = STUDY_METRIC
"""What a study's value is: the config's best TFLOP/s over its run-time variants on the problem."""


def make_sampler(name: str, *, seed: int, grid: dict[str, list[str]] | None = None) -> optuna.samplers.BaseSampler:
    """A sampler for `name` (one of SAMPLERS). Raises ValueError for an unknown name.

    TPE runs multivariate with the constant liar, so several trials can be pending while their
    kernels compile and run (Optuna has no batch ask).
    """
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                          n_startup_trials=8)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=8)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        if grid is None:
            raise ValueError("the grid sampler needs the parameter grid")
        return optuna.samplers.GridSampler(grid, seed=seed)
    raise ValueError(f"unknown sampler {name!r}: use one of {', '.join(SAMPLERS)}")
