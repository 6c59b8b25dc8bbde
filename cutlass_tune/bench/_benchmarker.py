"""The sweep's view of a GPU: `search.Benchmarker` over one benchmark worker."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..compile import CompiledKernel
from ..measurement import Measurement, TimingScheme
from ..space import Problem, RuntimeArgs
from ._job import Job
from ._race import RaceOptions
from ._session import require_gpu
from ._timing import TimingOptions
from ._worker import DEFAULT_TIMEOUT_S, Worker


class WorkerBenchmarker:
    """Measures kernels and the cuBLAS baseline in one isolated worker on GPU `device`.

    Raises:
        CutlassTuneError: no GPU is visible (from the constructor).
        WorkerError: the worker cannot start.
    """

    def __init__(self, device: int = 0, *, timing: TimingOptions = TimingOptions(),
                 timeout_s: float = DEFAULT_TIMEOUT_S, race: RaceOptions | None = None):
        require_gpu(device)
        self.timing = timing
        self.race = race
        """When set, `measure` races a kernel's variants (bench/_race.py)."""
        self.worker = Worker(device, timeout_s=timeout_s)
        env = self.worker.start()
        assert env is not None, "the default runner, GpuRunner, stamps its environment"
        self.env = env
        self.gpu_name = self.env.gpu
        self.sm_count = self.env.sm_count

    @property
    def scheme(self) -> TimingScheme:
        """The timing scheme of `timing` (what a results store binds to)."""
        return self.timing.scheme

    def baseline(self, problem: Problem) -> Measurement:
        return next(iter(self.worker.run(Job.baseline(problem, timing=self.timing))))

    def measure(self, kernel: CompiledKernel, problem: Problem, variants: Sequence[RuntimeArgs],
                bar: float | None = None) -> Iterator[Measurement]:
        """One Measurement per variant. `bar`: the problem's best full score so far (paired
        ratio, or TFLOP/s when unpaired), which a race measures its variants against."""
        yield from self.worker.run(Job.for_kernel(kernel, problem, tuple(variants), timing=self.timing,
                                                  race=self.race, bar=bar))

    def close(self) -> None:
        self.worker.close()
