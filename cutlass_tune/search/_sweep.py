"""The sweep loop: the strategy proposes configs, the CPU compiles, the GPUs measure, the store keeps.

The next batch compiles on a background thread while the current one is measured, on one GPU or
several of one model (each (kernel, problem) on one of them, next to cuBLAS measured on that
GPU). Each compiled kernel is measured on every problem of its operation, and its result is told
to the strategy and every study (`Studies`). Everything measured goes to the store one row at a time; a re-run
with the same store measures only what is missing (`Ledger`), and sweeps sharing a store measure
each config once (`Claims`).

This module never imports GPU code: the compiler and the benchmarker are passed in.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from ..compile import CompiledKernel
from ..errors import CutlassTuneError, GpuUnusableError
from ..measurement import Measurement, TimingScheme
from ..space import KernelConfig, Problem, RuntimeArgs, SearchSpace
from ..status import Status
from ..store import ResultStore
from ._claims import Claims
from ._lanes import LaneLost, Lanes
from ._ledger import Ledger
from ._state import ProblemProgress, SweepSettings, SweepState
from ._strategy import StrategyContext, make_strategy
from ._studies import Studies


class Benchmarker(Protocol):
    """Measures compiled kernels on problems (the GPU side, or a fake in tests). Raises
    GpuUnusableError when its GPU can measure no more (a sweep on several goes on without it)."""

    gpu_name: str
    sm_count: int

    @property
    def scheme(self) -> TimingScheme:
        """How it times kernels and baselines (a store holds one scheme)."""

    def baseline(self, problem: Problem) -> Measurement: ...

    def measure(self, kernel: CompiledKernel, problem: Problem, variants: Sequence[RuntimeArgs],
                bar: float | None = None) -> Iterator[Measurement]:
        """One Measurement per variant, yielded as each is taken (the sweep stores each at once).
        `bar`: the problem's best ratio so far when timing is paired, else its best TFLOP/s (a
        benchmarker that races variants leaves those far below it coarse)."""


Compiler = Callable[[Sequence[KernelConfig]], list[CompiledKernel]]


def require_one_model(benches: Sequence[Benchmarker]) -> None:
    """Raise CutlassTuneError unless all `benches` measure on one GPU model by one method."""
    first = benches[0]
    for b in benches[1:]:
        if (b.gpu_name, b.sm_count) != (first.gpu_name, first.sm_count):
            raise CutlassTuneError(
                f"the sweep's GPUs differ: {b.gpu_name} ({b.sm_count} SMs) beside {first.gpu_name} "
                f"({first.sm_count} SMs); a store holds one GPU model, so sweep each model on its own")
        if b.scheme != first.scheme:
            raise CutlassTuneError("the sweep's benchmarkers time by different methods")


@dataclasses.dataclass(frozen=True)
class _Task:
    """One kernel on one problem: the variants still to measure, all on one GPU."""

    kernel: CompiledKernel
    progress: ProblemProgress
    variants: tuple[RuntimeArgs, ...]


def _measure_task(bench: Benchmarker, task: _Task) -> Iterator[Measurement]:
    pp = task.progress
    bar = pp.best_ratio if bench.scheme.paired else pp.best_tflops
    return bench.measure(task.kernel, pp.problem, task.variants, bar=bar)


def _measure_baseline(bench: Benchmarker, progress: ProblemProgress) -> Iterator[Measurement]:
    yield bench.baseline(progress.problem)


def _remainder(task: _Task, taken: list[Measurement]) -> _Task | None:
    """The variants of `task` not in `taken`: what a lost GPU hands to the others."""
    names = {m.runtime.name for m in taken}
    rest = tuple(v for v in task.variants if v.name not in names)
    return dataclasses.replace(task, variants=rest) if rest else None


class Sweep:
    """Args:
        storage_url: where the Optuna studies live (usually the store's URL).
        benchmarker: one per GPU, all of one model (else CutlassTuneError); each measures the
            kernels handed to it next to its own cuBLAS baseline, in parallel with the others.
        on_update: called with the state whenever the display should change.

    Raises:
        StoreError: the store holds another GPU's results, or results of another timing method.
    """

    def __init__(self, space: SearchSpace, store: ResultStore, storage_url: str, compiler: Compiler,
                 benchmarker: Benchmarker | Sequence[Benchmarker], settings: SweepSettings = SweepSettings(),
                 on_update: Callable[[SweepState], None] | None = None):
        benches = list(benchmarker) if isinstance(benchmarker, Sequence) else [benchmarker]
        require_one_model(benches)
        self.lanes = Lanes(benches, retire_on=(GpuUnusableError,))
        self.space, self.store, self.compile, self.bench = space, store, compiler, benches[0]
        self.settings = settings
        self.on_update = on_update or (lambda state: None)
        self.gpu = self.bench.gpu_name
        store.bind_gpu(self.gpu)
        store.bind_timing(self.bench.scheme)
        run_id = uuid.uuid4().hex[:12]
        self.studies = Studies(space, storage_url, sampler=settings.sampler, seed=settings.seed, arch=settings.arch,
                               gpu=self.gpu, run_id=run_id)
        self.strategy = make_strategy(settings.strategy, StrategyContext(
            space, self.studies, store, self.gpu, self.bench.sm_count, self.bench.scheme,
            settings.seed))
        self.state = SweepState(problems=[ProblemProgress(s.problem, s.study) for s in self.studies], run_id=run_id)
        self.ledger = Ledger(store, space, space.problems)
        self.claims = Claims(store, run_id)
        self._deadline: float | None = None  # when `run` stops proposing (monotonic clock)

    # ---- the loop -------------------------------------------------------------------------
    def run(self) -> SweepState:
        """Run until `settings.trials` configs are compiled (counting earlier runs and configs
        other sweeps on the store hold), the timeout passes or the strategy runs out of new
        configs. Returns the final state, its `stop_reason` saying which.

        Other sweeps may run on the same store at once (other hosts): each claims a config in
        the store before compiling it, and one that another claimed first waits in its study
        for that sweep's results instead of being measured twice."""
        with self.store.running(self.state.run_id):
            return self._run()

    def _run(self) -> SweepState:
        timeout = self.settings.timeout_s
        self._deadline = None if timeout is None else time.monotonic() + timeout
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        try:
            batch = self._begin()
            future = self._submit(pool, batch + self._ask(self._room()))
            while future is not None:
                compiled = future.result()
                first = self._count_compiled(compiled)
                batch = [] if self._timed_out() else self._settle()
                batch += [] if self._timed_out() else self._ask(self._room() - len(batch))
                future = self._submit(pool, batch)
                if compiled:
                    self._measure_baselines()
                self._measure_batch(compiled, first)
                if future is None and self.claims and not self._timed_out():
                    self._absorb()  # last, what other sweeps finished meanwhile, or gave up unfinished
                    future = self._submit(pool, self._settle())
            self._absorb()
            self._best_in_store()  # another sweep on the store may have found a better one
            self.state.stop_reason = ("timeout" if self._timed_out() else
                                      "trial budget reached" if self._budget() <= 0 else "no new configs proposed")
        finally:
            self.state.elsewhere = len(self.claims)
            self.studies.abandon(self.claims.elsewhere)
            pool.shutdown(wait=False, cancel_futures=True)
        self.on_update(self.state)
        return self.state

    def _begin(self) -> list[KernelConfig]:
        """Resume: fail trials a dead sweep left, read the store, measure the baselines, seed
        the studies. Returns the configs an interrupted run left part-measured that are this
        sweep's to finish (a compile cache hit each), first of all."""
        self.studies.fail_left_over(self.store.live_runs() - {self.state.run_id})
        self._absorb()
        unfinished = self.ledger.unfinished()
        self._measure_baselines()
        self._best_in_store()
        self.strategy.warm_start()
        self.on_update(self.state)
        for cfg in unfinished:
            self.studies.expect(cfg)
        return [cfg for cfg in unfinished if self.claims.claim(cfg)]

    def _timed_out(self) -> bool:
        return self._deadline is not None and time.monotonic() > self._deadline

    def _budget(self) -> int:
        """Configs left to compile: those another sweep holds will be compiled too."""
        return self.settings.trials - len(self.ledger.compiled | self.claims.others())

    def _room(self) -> int:
        return min(self.settings.batch, self._budget())

    def _ask(self, want: int) -> list[KernelConfig]:
        batch = self.strategy.ask(want, self.ledger, self.claims)
        self.state.invalid = self.studies.invalid
        return batch

    def _settle(self) -> list[KernelConfig]:
        """Tell the trials of configs other sweeps finished their results; return those they
        gave up unfinished (now claimed here), to compile and measure what is missing."""
        finished, taken = self.claims.settle(self.ledger)
        for cfg in finished:
            self.strategy.tell(cfg, self.ledger)
        self.state.elsewhere = len(self.claims)
        return taken

    def _submit(self, pool: concurrent.futures.Executor, batch: list[KernelConfig]
                ) -> concurrent.futures.Future | None:
        self.state.queued = len(batch)
        return pool.submit(self.compile, batch) if batch else None

    def _absorb(self) -> None:
        self.ledger.absorb()
        self.state.compiled = len(self.ledger.compiled)

    def _count_compiled(self, compiled: Sequence[CompiledKernel]) -> int:
        """Count a compiled batch (after what another sweep measured meanwhile); the compile
        index of its first kernel."""
        self._absorb()
        first = len(self.ledger.compiled) + 1
        self.ledger.add_compiled([k.config.hash for k in compiled])
        self.state.compiled = len(self.ledger.compiled)
        return first

    # ---- measuring ------------------------------------------------------------------------
    def _measure_batch(self, compiled: Sequence[CompiledKernel], first: int) -> None:
        """Measure every missing variant of `compiled` on every problem of its operation, on all
        GPUs at once; tell each kernel's trials as soon as its last problem is measured.
        `first`: the compile index of the batch's first kernel."""
        at = {k.config.hash: first + i for i, k in enumerate(compiled)}
        open_tasks: collections.Counter = collections.Counter()
        tasks: list[_Task] = []
        for kernel in compiled:
            for pp in self._problems_of(kernel.config):
                if kernel.status is not Status.OK:
                    self._compile_failed(pp, kernel)
                elif missing := self.ledger.missing(kernel.config, pp.problem):
                    tasks.append(_Task(kernel, pp, tuple(missing)))
                    open_tasks[kernel.config.hash] += 1
                else:
                    self._count(pp, kernel.config)
        for kernel in compiled:
            if not open_tasks[kernel.config.hash]:
                self._kernel_done(kernel.config)
        for event in self.lanes.run(tasks, _measure_task, remainder=_remainder):
            if isinstance(event, LaneLost):
                self._lose(event)
            elif event.result is not None:
                self._take(event.task, event.lane, event.result, at[event.task.kernel.config.hash])
            else:
                cfg = event.task.kernel.config
                self._count(event.task.progress, cfg)
                open_tasks[cfg.hash] -= 1
                if not open_tasks[cfg.hash]:
                    self._kernel_done(cfg)

    def _problems_of(self, cfg: KernelConfig) -> list[ProblemProgress]:
        """The problems of `cfg`'s operation."""
        operation = cfg.operation
        return [pp for pp in self.state.problems if pp.problem.operation == operation]

    def _compile_failed(self, pp: ProblemProgress, kernel: CompiledKernel) -> None:
        # A transient failure (a timeout, nvcc killed, a full disk) is not the kernel's outcome:
        # not stored, so that a later run compiles the config again.
        if not kernel.transient and not self.ledger.tried(pp.problem, kernel.config.hash):
            self._record(pp, Measurement(problem=pp.problem, config=kernel.config, runtime=RuntimeArgs(),
                                         status=kernel.status, reason=kernel.reason,
                                         compile_seconds=kernel.seconds), lane=0)
        self.ledger.fail(pp.problem, kernel.config.hash)

    def _take(self, task: _Task, lane: int, m: Measurement, at: int) -> None:
        """Store a kernel's measurement `m` of `task`, taken on `lane`; a better ratio than the
        problem's best is the new best (`at`: the kernel's compile index)."""
        pp = task.progress
        self._record(pp, m, lane=lane)
        if m.status is Status.OK and m.tflops:
            # The paired baseline when there is one, else cuBLAS measured on the same GPU before the batch.
            cublas = pp.cublas_by_lane.get(lane)
            ratio = m.paired_ratio or (m.tflops / cublas if cublas else None)
            if ratio and (pp.best_ratio is None or ratio > pp.best_ratio):
                pp.best_tflops, pp.best_ratio, pp.best_at = m.tflops, ratio, at
                pp.best_config = task.kernel.config

    def _record(self, pp: ProblemProgress, m: Measurement, lane: int) -> None:
        self.store.add(m, gpu=self.gpu, run_id=self.state.run_id, cublas_tflops=pp.cublas_by_lane.get(lane),
                       study=pp.study.study_name)
        self.ledger.note(m)

    def _count(self, pp: ProblemProgress, cfg: KernelConfig) -> None:
        pp.measured += 1
        pp.failed += self.ledger.value(pp.problem, cfg.hash) is None

    def _kernel_done(self, cfg: KernelConfig) -> None:
        self.strategy.tell(cfg, self.ledger)
        self.claims.release(cfg)
        self.on_update(self.state)

    def _measure_baselines(self) -> None:
        """cuBLAS on every problem and GPU, now: before each batch, so that each kernel's ratio is
        taken against a baseline measured minutes, not the whole run, away (the board's
        power-limited clock drifts by a few percent over a run), on the GPU that measures it."""
        for event in self.lanes.run(self.state.problems, _measure_baseline, every_lane=True):
            if isinstance(event, LaneLost):
                self._lose(event)
            elif event.result is not None:
                pp, base = event.task, event.result
                self.store.add(base, gpu=self.gpu, run_id=self.state.run_id, study=pp.study.study_name)
                pp.cublas_by_lane[event.lane] = base.tflops if base.status is Status.OK else None
        shown = min(i for i in range(len(self.lanes)) if i not in self.lanes.lost)
        for pp in self.state.problems:
            pp.cublas_tflops = pp.cublas_by_lane.get(shown)

    def _best_in_store(self) -> None:
        """Take as each problem's best the best in the store where it beats the one shown (found
        by an earlier run, or by another sweep on the store)."""
        progress = {pp.problem.name: pp for pp in self.state.problems}
        for row in self.store.rows(["problem", "config_hash", "status", "tflops", "ratio"]):
            pp = progress.get(row.problem or "")
            if pp is None or row.status is not Status.OK or not row.config_hash or not row.ratio:
                continue
            if pp.best_ratio is None or row.ratio > pp.best_ratio * (1 + 1e-9):  # not our own again
                pp.best_ratio, pp.best_tflops, pp.best_at = row.ratio, row.tflops, None
                pp.best_config = self.ledger.config_for(row.config_hash, pp.problem)

    def _lose(self, event: LaneLost) -> None:
        self.state.lost.append(event.reason)
        self.on_update(self.state)
