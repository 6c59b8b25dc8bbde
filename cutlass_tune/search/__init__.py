"""Search stage: what to compile and measure next (Optuna ask/tell; never touches the GPU)."""

from ._params import ParamSpace, config_of, params_of
from ._samplers import SAMPLERS, make_sampler
from ._seeds import COMMON_DEFAULTS, seed_configs
from ._sweep import Benchmarker, ProblemProgress, Sweep, SweepSettings, SweepState, study_name

__all__ = [
    "Benchmarker", "COMMON_DEFAULTS", "ParamSpace", "ProblemProgress", "SAMPLERS", "Sweep",
    "SweepSettings", "SweepState", "config_of", "make_sampler", "params_of", "seed_configs", "study_name",
]
