"""Bench stage: compiled kernel + problem -> `Measurement` (GPU worker, verification, timing).

Kernels run in a worker subprocess per GPU (`Worker`), which survives CUDA errors and hangs by
being replaced. Each (kernel, problem, run-time variant) is checked against an fp32 reference
before it is timed; the cuBLAS baseline goes through the same checks and the same timing
function.
"""

from typing import TYPE_CHECKING, Any

from ._benchmarker import WorkerBenchmarker
from ._env import ClockMonitor, env_stamp
from ._job import InvalidJobError, Job
from ._race import RaceOptions
from ._regimes import regime_options, time_regime
from ._runner import GpuRunner
from ._session import Plan, baseline_ratio, plan_jobs, repeat_spread, require_gpu, run_plan
from ._timing import L2Flush, TimingOptions, TimingStats, summarize, time_launches, time_paired
from ._verify import TOLERANCE, Operands, Verdict, compare, verify_launch
from ._worker import DEFAULT_TIMEOUT_S, Worker, WorkerError, WorkerStartError

if TYPE_CHECKING:  # what `__getattr__` gives, for the type checker
    from ._check import GAP, EntryCheck, check_table

__all__ = [
    "ClockMonitor", "DEFAULT_TIMEOUT_S", "EntryCheck", "GAP", "GpuRunner", "InvalidJobError", "Job", "L2Flush",
    "Operands", "Plan", "RaceOptions",
    "TOLERANCE", "TimingOptions", "TimingStats", "Verdict", "Worker", "WorkerBenchmarker", "WorkerError",
    "WorkerStartError",
    "baseline_ratio", "check_table", "compare", "env_stamp", "plan_jobs", "regime_options", "repeat_spread",
    "require_gpu", "run_plan", "summarize", "time_launches", "time_paired", "time_regime", "verify_launch",
]


def __getattr__(name: str) -> Any:
    # The call-site check runs `matmul` with its tables (pandas): imported on first use, so
    # that benchmark workers start without them.
    if name in ("GAP", "EntryCheck", "check_table"):
        from . import _check

        return getattr(_check, name)
    raise AttributeError(f"module 'cutlass_tune.bench' has no attribute {name!r}")
