"""Search stage: what to compile and measure next (Optuna ask/tell; never touches the GPU)."""

from ._confirm import CONFIRM_STUDY, Candidate, ConfirmResult, candidates, confirm
from ._lanes import LaneEvent, LaneLost, Lanes
from ._optuna_strategy import OptunaStrategy
from ._params import ParamSpace, config_of, params_of
from ._prior_strategy import PriorStrategy
from ._samplers import SAMPLERS, make_sampler
from ._seeds import COMMON_DEFAULTS, seed_configs
from ._state import ProblemProgress, SweepSettings, SweepState
from ._strategy import STRATEGIES, Strategy, StrategyContext, make_strategy, register_strategy
from ._studies import Studies, Study, study_name
from ._sweep import Benchmarker, Sweep, require_one_model

__all__ = [
    "Benchmarker", "COMMON_DEFAULTS", "CONFIRM_STUDY", "Candidate", "ConfirmResult", "LaneEvent", "LaneLost",
    "Lanes", "OptunaStrategy", "ParamSpace", "PriorStrategy", "ProblemProgress", "SAMPLERS", "STRATEGIES",
    "Strategy", "StrategyContext", "Studies", "Study", "Sweep", "SweepSettings", "SweepState", "candidates",
    "config_of", "confirm", "make_sampler", "make_strategy", "params_of", "register_strategy", "require_one_model",
    "seed_configs", "study_name",
]
