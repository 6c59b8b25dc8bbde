"""A benchmark run: every (compiled kernel, problem, run-time variant), with the cuBLAS
baseline of each problem measured by the same worker in the same pass."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence

from .._devices import NO_GPU_MESSAGE
from ..compile import CompiledKernel
from ..errors import CutlassTuneError
from ..measurement import Measurement
from ..space import KernelConfig, Problem, RuntimeArgs, check_pair
from ..status import Status
from ._job import Job
from ._timing import TimingOptions
from ._worker import DEFAULT_TIMEOUT_S, RunnerFactory, Worker


def require_gpu(device: int = 0) -> None:
    """Raise CutlassTuneError unless CUDA device `device` is visible (creates no context)."""
    import torch

    if not torch.cuda.is_available():
        raise CutlassTuneError(NO_GPU_MESSAGE)
    count = torch.cuda.device_count()
    if not 0 <= device < count:
        raise CutlassTuneError(f"GPU {device} is not visible: there are {count} (0 to {count - 1})")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a run measures: `jobs` in order, and the outcomes known without a GPU (kernels
    that did not compile or timed out compiling: COMPILE_ERROR, one per problem they would
    have run)."""

    jobs: tuple[Job, ...]
    failures: tuple[Measurement, ...]

    @property
    def size(self) -> int:
        """Measurements the run will produce."""
        return len(self.failures) + sum(len(j.variants) for j in self.jobs)


def plan_jobs(
    kernels: Sequence[CompiledKernel],
    problems: Sequence[Problem],
    variants: Callable[[KernelConfig], Sequence[RuntimeArgs]],
    *,
    timing: TimingOptions = TimingOptions(),
    repeat: int = 1,
) -> Plan:
    """Jobs for each pass (`repeat` of them): per problem, the baseline first, then every
    compiled kernel whose types and layouts match the problem.

    Raises:
        InvalidJobError: a problem or a variant breaks a rule (see `Job`).
    """
    jobs: list[Job] = []
    failures: list[Measurement] = []
    for problem in problems:
        for k in kernels:
            if k.status is not Status.OK and not check_pair(k.config, problem):
                # An nvcc timeout too: the kernel never ran, so it is not a run-time TIMEOUT.
                failures.append(Measurement(
                    problem=problem, config=k.config, runtime=RuntimeArgs(), status=Status.COMPILE_ERROR,
                    reason=f"{k.reason} (source {k.source_path}, log {k.log_path})",
                    symbol=k.symbol, compile_seconds=k.seconds,
                ))
    for rep in range(repeat):
        for p_index, problem in enumerate(problems):
            common = dict(timing=timing, repeat=rep, seed=p_index)
            jobs.append(Job.baseline(problem, **common))
            for k in kernels:
                if k.status is Status.OK and not check_pair(k.config, problem):
                    jobs.append(Job.for_kernel(k, problem, tuple(variants(k.config)), **common))
    return Plan(jobs=tuple(jobs), failures=tuple(failures))


def run_plan(plan: Plan, *, device: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S,
             factory: RunnerFactory | None = None) -> Iterator[Measurement]:
    """Measure a plan on one GPU, yielding each Measurement as it is known (compile failures
    first, stamped with the worker's environment).

    Raises:
        WorkerError: the worker cannot start, or our own code failed in it.
    """
    with Worker(device, factory=factory, timeout_s=timeout_s) as worker:
        env = worker.start()
        for m in plan.failures:
            yield dataclasses.replace(m, env=env)
        for job in plan.jobs:
            yield from worker.run(job)


def baseline_ratio(m: Measurement, baselines: dict[tuple[Problem, int], Measurement]) -> float | None:
    """Speed of `m` relative to cuBLAS (>1: faster): its paired baseline when it has one,
    else the baseline of its problem in the same pass."""
    if m.paired_ratio is not None:
        return m.paired_ratio
    base = baselines.get((m.problem, m.repeat))
    if m.status is not Status.OK or base is None or base.status is not Status.OK:
        return None
    if not m.median_ms or not base.median_ms:  # an OK measurement has both
        return None
    return base.median_ms / m.median_ms


def repeat_spread(measurements: Iterable[Measurement]) -> list[float]:
    """Run-to-run disagreement: for each (problem, kernel, variant) measured OK in more than
    one pass, (max - min) / min of its medians."""
    medians: dict[tuple, list[float]] = {}
    for m in measurements:
        if m.status is Status.OK and m.median_ms is not None:
            medians.setdefault((m.problem, m.kernel_name, m.runtime), []).append(m.median_ms)
    return [(max(v) - min(v)) / min(v) for v in medians.values() if len(v) > 1]
