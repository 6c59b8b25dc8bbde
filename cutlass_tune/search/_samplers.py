"""Optuna samplers by name, all taught about invalid configs through constraints.

Invalid configs never reach nvcc. Their trials complete with the constraint `invalid` set to 1
(`Trial.set_constraint`), so TPE and GP rank them below every valid (feasible) trial and
learn where the invalid region lies; random and grid sampling simply move on.
"""

from __future__ import annotations

import optuna

SAMPLERS = ("tpe", "gp", "random", "grid")
CONSTRAINT = "invalid"
"""Constraint name: 1 for an invalid config (infeasible), 0 for a valid one."""


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
