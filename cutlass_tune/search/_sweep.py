"""The sweep loop: Optuna proposes configs, the CPU compiles, the GPU measures, the store keeps.

One Optuna study per problem (named from problem, types, layout, arch and GPU) over the
compile-time knobs. A trial's value is the best TFLOP/s over its run-time variants. Each
compiled kernel is measured on every problem of the sweep, and its result is added to every
study, so one compile informs all shapes. The next batch compiles on a background thread while
the current one is measured, on one GPU or several of one model (each (kernel, problem) on one
of them, next to cuBLAS measured on that GPU). Everything measured goes to the store one row at
a time; a re-run with the same store measures only what is missing.

This module never imports GPU code: the compiler and the benchmarker are passed in.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import time
import uuid
from typing import Callable, Iterator, Protocol, Sequence

import optuna

from ..compile import CompiledKernel
from ..errors import CutlassTuneError, GpuUnusableError
from ..measurement import Measurement
from ..space import KernelConfig, Problem, RuntimeArgs, SearchSpace, check_config
from ..status import Status
from ..store import ResultStore, open_study_storage
from ._lanes import LaneLost, Lanes
from ._params import ParamSpace, config_of, params_of
from ._samplers import CONSTRAINT, make_sampler
from ._seeds import operand_kind, seed_configs

optuna.logging.set_verbosity(optuna.logging.WARNING)


class Benchmarker(Protocol):
    """Measures compiled kernels on problems (the GPU side, or a fake in tests). Raises
    GpuUnusableError when its GPU can measure no more (a sweep on several goes on without it)."""

    gpu_name: str
    sm_count: int
    timing_method: str  # "events" or "graph", "-paired" appended when baselines are paired; a store holds one

    def baseline(self, problem: Problem) -> Measurement: ...

    def measure(self, kernel: CompiledKernel, problem: Problem,
                variants: Sequence[RuntimeArgs]) -> Iterator[Measurement]:
        """One Measurement per variant, yielded as each is taken (the sweep stores each at once)."""


Compiler = Callable[[Sequence[KernelConfig]], list[CompiledKernel]]


@dataclasses.dataclass(frozen=True)
class SweepSettings:
    trials: int = 48
    """Most configs compiled and measured in this store (earlier runs count)."""
    timeout_s: float | None = None
    sampler: str = "tpe"
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


ASKS_PER_CONFIG = 50
"""How many proposals a batch may ask of the studies per config it wants (plus two configs'
worth) before it takes configs never proposed in the file's order (`Sweep._unproposed`)."""


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


def study_name(problem: Problem, arch: str, gpu: str) -> str:
    return f"{problem.name}_{arch}_{gpu.replace(' ', '-')}"


@dataclasses.dataclass(frozen=True)
class _Task:
    """One kernel on one problem: the variants still to measure, all on one GPU."""

    kernel: CompiledKernel
    progress: ProblemProgress
    variants: tuple[RuntimeArgs, ...]


def _measure_task(bench: Benchmarker, task: _Task) -> Iterator[Measurement]:
    return bench.measure(task.kernel, task.progress.problem, task.variants)


def _measure_baseline(bench: Benchmarker, progress: ProblemProgress) -> Iterator[Measurement]:
    yield bench.baseline(progress.problem)


def _remainder(task: _Task, taken: list[Measurement]) -> _Task | None:
    """The variants of `task` not in `taken`: what a lost GPU hands to the others."""
    names = {m.runtime.name for m in taken}
    rest = tuple(v for v in task.variants if v.name not in names)
    return dataclasses.replace(task, variants=rest) if rest else None


def require_one_model(benches: Sequence[Benchmarker]) -> None:
    """Raise CutlassTuneError unless all `benches` measure on one GPU model by one method."""
    first = benches[0]
    for i, b in enumerate(benches[1:], start=1):
        if (b.gpu_name, b.sm_count) != (first.gpu_name, first.sm_count):
            raise CutlassTuneError(
                f"the sweep's GPUs differ: {b.gpu_name} ({b.sm_count} SMs) beside {first.gpu_name} "
                f"({first.sm_count} SMs); a store holds one GPU model, so sweep each model on its own")
        if getattr(b, "timing_method", "events") != getattr(first, "timing_method", "events"):
            raise CutlassTuneError("the sweep's benchmarkers time by different methods")


class Sweep:
    """Args:
        benchmarker: one per GPU, all of one model (else CutlassTuneError); each measures the
            kernels handed to it next to its own cuBLAS baseline, in parallel with the others.
    """

    def __init__(self, space: SearchSpace, store: ResultStore, storage_url: str, compiler: Compiler,
                 benchmarker: Benchmarker | Sequence[Benchmarker], settings: SweepSettings = SweepSettings(),
                 on_update: Callable[[SweepState], None] | None = None):
        benches = list(benchmarker) if isinstance(benchmarker, (list, tuple)) else [benchmarker]
        require_one_model(benches)
        self.lanes = Lanes(benches, retire_on=(GpuUnusableError,))
        self.space, self.store, self.compile, self.bench = space, store, compiler, benches[0]
        self.settings = settings
        self.on_update = on_update or (lambda state: None)
        self.gpu = self.bench.gpu_name
        store.bind_gpu(self.gpu)
        store.bind_timing(getattr(self.bench, "timing_method", "events"))
        self.storage = open_study_storage(storage_url)
        self.params = {p: ParamSpace.from_space(space, p) for p in space.problems}
        progress = []
        for p in space.problems:
            sampler = make_sampler(settings.sampler, seed=settings.seed, grid=self.params[p].grid())
            study = optuna.create_study(study_name=study_name(p, settings.arch, self.gpu), storage=self.storage,
                                        sampler=sampler, direction="maximize", load_if_exists=True)
            progress.append(ProblemProgress(problem=p, study=study))
        self.state = SweepState(problems=progress, run_id=uuid.uuid4().hex[:12])
        # (problem name, config hash) -> runtime names already measured, from this or earlier runs
        self.done: dict[tuple[str, str], set[str]] = {}
        self.results: dict[tuple[str, str], float | None] = {}
        self.compiled_hashes: set[str] = set()
        self.in_study: dict[str, set[str]] = {pp.study.study_name: set() for pp in progress}
        self._turn = 0  # the next study `_propose` asks
        # Configs proposed here that another sweep on the store claimed first (it measures them;
        # `_settle_elsewhere` tells their trials its results, or takes them over if it dies).
        self.elsewhere: dict[str, KernelConfig] = {}
        self._seen_id = 0  # the last store row `_absorb_store` read

    # ---- resume -------------------------------------------------------------------------
    def _load_previous(self) -> list[KernelConfig]:
        """Read the store and studies; fail trials a dead sweep left running (a live sweep's
        are its own: should one be taken for dead, it adds its results as trials of their own,
        see `_tell`); return configs whose measurement is incomplete (to finish first)."""
        unfinished: dict[str, KernelConfig] = {}
        live = self.store.live_runs() - {self.state.run_id}
        for pp in self.state.problems:
            for t in pp.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
                # A live sweep's trial is its own; one without an owner may be one a live sweep
                # is asking for this moment (`_propose` names the owner right after).
                if t.user_attrs.get("run_id") in live or ("run_id" not in t.user_attrs and live):
                    continue
                with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # another sweep's look
                    self.storage.set_trial_user_attr(t._trial_id, "reason", "interrupted")
                    self.storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
            for t in pp.study.get_trials(deepcopy=False):
                if "config_hash" in t.user_attrs:
                    self.in_study[pp.study.study_name].add(t.user_attrs["config_hash"])
        self._absorb_store()
        for cfg_hash in self.compiled_hashes:
            for pp in self.state.problems:
                cfg = self._config_for(cfg_hash, pp.problem)
                if cfg is not None and not check_config(cfg) and self._missing(cfg, pp.problem):
                    unfinished[cfg_hash] = cfg
        self.state.compiled = len(self.compiled_hashes)
        return list(unfinished.values())

    def _absorb_store(self) -> None:
        """Fold the store's rows not yet seen into what is compiled and measured: at the start
        those of earlier runs, later those of another sweep on the same store (another host)
        and this run's own. So a config another sweep measured is not measured again, and
        `--trials` counts the configs of the whole store."""
        rows = self.store.rows(["id", "problem", "config_hash", "runtime", "status", "tflops"],
                               after_id=self._seen_id)
        for row in rows:
            if row["config_hash"] is None:
                continue  # the cuBLAS baseline, or a hand-written kernel
            key = (row["problem"], row["config_hash"])
            if row["status"] != Status.INVALID.value:
                self.compiled_hashes.add(row["config_hash"])
            self.done.setdefault(key, set()).add(row["runtime"])
            if row["status"] == Status.OK.value and row["tflops"]:
                self.results[key] = max(self.results.get(key) or 0.0, row["tflops"])
            else:
                self.results.setdefault(key, None)
        if rows:
            self._seen_id = rows[-1]["id"]
        self.state.compiled = len(self.compiled_hashes)

    def _config_for(self, cfg_hash: str, problem: Problem) -> KernelConfig | None:
        for c in self.space.candidates:
            if c.hash == cfg_hash:
                return config_of(params_of(c), problem)
        return None

    def _missing(self, cfg: KernelConfig, problem: Problem) -> list[RuntimeArgs]:
        have = self.done.get((problem.name, cfg.hash), set())
        return [v for v in self.space.runtime_variants(cfg) if v.name not in have]

    def _complete(self, cfg: KernelConfig) -> bool:
        """Whether `cfg` was measured on every problem it applies to, every variant."""
        return not any(self._missing(cfg, pp.problem) for pp in self.state.problems
                       if config_of(params_of(cfg), pp.problem).hash == cfg.hash)

    # ---- proposing ------------------------------------------------------------------------
    def _tell(self, pp: ProblemProgress, trial: optuna.Trial, cfg: KernelConfig,
              value: float | None, reason: str = "", invalid: bool = False) -> None:
        self.in_study[pp.study.study_name].add(cfg.hash)
        if self.storage.get_trial(trial._trial_id).state.is_finished():
            # Another sweep that started on this store meanwhile took this one for dead and failed
            # it as left over (`_load_previous`): keep the result in the study as a trial of its own.
            self._add_trial(pp, trial.params, cfg, value, reason, invalid)
            return
        trial.set_user_attr("config_hash", cfg.hash)
        trial.set_user_attr("config", cfg.name)
        trial.set_constraint(CONSTRAINT, 1.0 if invalid else 0.0)
        if reason:
            trial.set_user_attr("reason", reason)
        if invalid:
            pp.study.tell(trial, 0.0)  # infeasible: the constraint, not this value, ranks it
        elif value is None:
            pp.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            pp.study.tell(trial, value)

    def _propose(self, want: int, pending: dict[str, KernelConfig],
                 waiting: dict[str, list[tuple[ProblemProgress, optuna.Trial]]]) -> list[KernelConfig]:
        """Ask the studies (round robin, where the last call stopped: with more problems than a
        batch holds, restarting at the first would leave the last studies never asked) until
        `want` new configs are pending. Invalid, already measured and already pending proposals
        are answered without a compile."""
        batch: list[KernelConfig] = []
        attempts = 0
        limit = ASKS_PER_CONFIG * (max(want, 1) + 2)
        while len(batch) < want and attempts < limit:
            pp = self.state.problems[self._turn % len(self.state.problems)]
            self._turn += 1
            attempts += 1
            try:
                trial = pp.study.ask(self.params[pp.problem].distributions())
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # a sweep starting on the store took this one for dead as Optuna made the trial
            cfg = config_of(trial.params, pp.problem)
            why = check_config(cfg)
            if cfg.hash not in self.params[pp.problem].members:
                why = why or ["not in the search space"]
            if why:
                self.state.invalid += 1
                self._tell(pp, trial, cfg, None, reason=str(why[0]), invalid=True)
                continue
            if cfg.hash in self.compiled_hashes and self._complete(cfg):
                value = self.results.get((pp.problem.name, cfg.hash))
                self._tell(pp, trial, cfg, value, reason="" if value else self._failure_reason(pp.problem, cfg))
                continue
            # The trial waits for a measurement: name its owner, so that a sweep starting on the
            # store while this one lives leaves it alone even if a third one died (`_load_previous`).
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # see `_tell`
                trial.set_user_attr("run_id", self.state.run_id)
            if cfg.hash in pending or cfg.hash in self.elsewhere:
                waiting[cfg.hash].append((pp, trial))
                continue
            if self.store.claim(cfg.hash, self.state.run_id):  # another sweep measures it now
                self.elsewhere[cfg.hash] = cfg
                waiting[cfg.hash] = [(pp, trial)]
                continue
            pending[cfg.hash] = cfg
            waiting[cfg.hash] = [(pp, trial)]
            batch.append(cfg)
        if len(batch) < want:
            batch += self._unproposed(want - len(batch), pending, waiting)
        return batch

    def _unproposed(self, want: int, pending: dict[str, KernelConfig],
                    waiting: dict[str, list[tuple[ProblemProgress, optuna.Trial]]]) -> list[KernelConfig]:
        """Up to `want` valid configs of the space never compiled, pending or held by another
        sweep, in the file's order, asked by no study: for when the samplers stall (they keep
        proposing known or invalid configs, as in a short list of configs or a space whose rest
        other sweeps hold), so that a sweep does not stop short of `--trials` with configs left.
        `_finish` adds their results to every study."""
        taken: list[KernelConfig] = []
        members = set().union(*(self.params[pp.problem].members for pp in self.state.problems))
        for cfg in self.space.candidates:
            if len(taken) == want:
                break
            if (cfg.hash in pending or cfg.hash in self.elsewhere or cfg.hash in self.compiled_hashes
                    or cfg.hash not in members or check_config(cfg)):
                continue
            if self.store.claim(cfg.hash, self.state.run_id):
                continue  # another sweep measures it: nothing waits on it here
            pending[cfg.hash], waiting[cfg.hash] = cfg, []
            taken.append(cfg)
        return taken

    def _settle_elsewhere(self, pending: dict[str, KernelConfig],
                          waiting: dict[str, list[tuple[ProblemProgress, optuna.Trial]]]) -> list[KernelConfig]:
        """Tell the trials of configs another sweep has finished measuring (in the store as last
        absorbed) its results; claim those it gave up unfinished (it stopped, or died) and return
        them, to compile and measure what is missing."""
        taken = []
        for cfg in list(self.elsewhere.values()):
            if cfg.hash in self.compiled_hashes and self._complete(cfg):
                del self.elsewhere[cfg.hash]
                self._finish(cfg, waiting.pop(cfg.hash, []))
            elif not self.store.claim(cfg.hash, self.state.run_id):
                del self.elsewhere[cfg.hash]
                pending[cfg.hash] = cfg
                taken.append(cfg)
        self.state.elsewhere = len(self.elsewhere)
        return taken

    # ---- measuring ------------------------------------------------------------------------
    def _measure_batch(self, compiled: Sequence[CompiledKernel], before: int, pending: dict[str, KernelConfig],
                       waiting: dict[str, list[tuple[ProblemProgress, optuna.Trial]]]) -> None:
        """Measure every missing variant of `compiled` on every problem it applies to, on all
        GPUs at once; tell each kernel's trials as soon as its last problem is measured."""
        index = {k.config.hash: before + i + 1 for i, k in enumerate(compiled)}
        kernels = {k.config.hash: k for k in compiled}
        open_tasks: collections.Counter = collections.Counter()
        tasks: list[_Task] = []
        for kernel in compiled:
            cfg = kernel.config
            for pp in self.state.problems:
                if config_of(params_of(cfg), pp.problem).hash != cfg.hash:
                    continue  # another type or layout: not this kernel's problem
                key = (pp.problem.name, cfg.hash)
                if kernel.status is not Status.OK:
                    if not self.done.get(key):
                        self._record(pp, Measurement(problem=pp.problem, config=cfg, runtime=RuntimeArgs(),
                                                     status=kernel.status, reason=kernel.reason,
                                                     compile_seconds=kernel.seconds), lane=0)
                    self.results[key] = None
                    continue
                missing = self._missing(cfg, pp.problem)
                if missing:
                    tasks.append(_Task(kernel, pp, tuple(missing)))
                    open_tasks[cfg.hash] += 1
                else:
                    self._count(pp, key)
        for kernel in compiled:
            if not open_tasks[kernel.config.hash]:
                self._kernel_done(kernel.config, pending, waiting)
        for event in self.lanes.run(tasks, _measure_task, remainder=_remainder):
            if isinstance(event, LaneLost):
                self._lose(event)
                continue
            task, pp = event.task, event.task.progress
            cfg = task.kernel.config
            key = (pp.problem.name, cfg.hash)
            m = event.result
            if m is None:
                self._count(pp, key)
                open_tasks[cfg.hash] -= 1
                if not open_tasks[cfg.hash]:
                    self._kernel_done(kernels[cfg.hash].config, pending, waiting)
                continue
            self._record(pp, m, lane=event.lane)
            if m.status is Status.OK and m.tflops:
                self.results[key] = max(self.results.get(key) or 0.0, m.tflops)
                # The paired baseline when there is one, else cuBLAS measured on the same GPU
                # before the batch.
                cublas = pp.cublas_by_lane.get(event.lane)
                ratio = m.paired_ratio or (m.tflops / cublas if cublas else None)
                if ratio and (pp.best_ratio is None or ratio > pp.best_ratio):
                    pp.best_tflops, pp.best_config, pp.best_at, pp.best_ratio = m.tflops, cfg, index[cfg.hash], ratio
            else:
                self.results.setdefault(key, None)

    def _count(self, pp: ProblemProgress, key: tuple[str, str]) -> None:
        pp.measured += 1
        pp.failed += self.results.get(key) is None

    def _kernel_done(self, cfg: KernelConfig, pending: dict[str, KernelConfig],
                     waiting: dict[str, list[tuple[ProblemProgress, optuna.Trial]]]) -> None:
        self._finish(cfg, waiting.pop(cfg.hash, []))
        pending.pop(cfg.hash, None)
        self.store.release(cfg.hash, self.state.run_id)
        self.on_update(self.state)

    def _record(self, pp: ProblemProgress, m: Measurement, lane: int) -> None:
        key = (pp.problem.name, m.config.hash)
        self.done.setdefault(key, set()).add(m.runtime.name)
        self.store.add(m, gpu=self.gpu, run_id=self.state.run_id, cublas_tflops=pp.cublas_by_lane.get(lane),
                       study=pp.study.study_name)

    def _finish(self, cfg: KernelConfig, waiting: list[tuple[ProblemProgress, optuna.Trial]]) -> None:
        """Tell the asking trials, and add the result to every other study."""
        asked = set()
        for pp, trial in waiting:
            value = self.results.get((pp.problem.name, cfg.hash))
            reason = "" if value else self._failure_reason(pp.problem, cfg)
            self._tell(pp, trial, config_of(trial.params, pp.problem), value, reason=reason)
            asked.add(pp.study.study_name)
        for pp in self.state.problems:
            pcfg = config_of(params_of(cfg), pp.problem)
            name = pp.study.study_name
            if name in asked or pcfg.hash != cfg.hash or cfg.hash in self.in_study[name]:
                continue
            value = self.results.get((pp.problem.name, cfg.hash))
            dists = self.params[pp.problem].distributions()
            params = self.params[pp.problem].params(cfg)
            if config_of(params, pp.problem).hash != cfg.hash or any(
                params[k] not in dists[k].choices for k in params
            ):
                continue
            reason = "" if value is not None else self._failure_reason(pp.problem, cfg)
            self._add_trial(pp, params, cfg, value, reason)
            self.in_study[name].add(cfg.hash)

    def _add_trial(self, pp: ProblemProgress, params: dict, cfg: KernelConfig, value: float | None,
                   reason: str = "", invalid: bool = False) -> None:
        """Add a finished trial of `cfg` to `pp`'s study without asking for it."""
        attrs = {"config_hash": cfg.hash, "config": cfg.name}
        if reason:
            attrs["reason"] = reason
        complete = invalid or value is not None
        pp.study.add_trial(optuna.trial.create_trial(
            params=params, distributions=self.params[pp.problem].distributions(),
            value=(0.0 if invalid else value) if complete else None,
            state=optuna.trial.TrialState.COMPLETE if complete else optuna.trial.TrialState.FAIL,
            user_attrs=attrs, constraints={CONSTRAINT: 1.0 if invalid else 0.0}))

    def _failure_reason(self, problem: Problem, cfg: KernelConfig) -> str:
        for (h, _), found in self.store.measured(problem).items():
            if h == cfg.hash:
                for r in found:
                    if r["status"] != Status.OK.value:
                        return f"{r['status']}: {r['reason']}"[:300]
        return "no result"

    def _measure_baselines(self) -> None:
        """cuBLAS on every problem and GPU, now: before each batch, so that each kernel's ratio is
        taken against a baseline measured minutes, not the whole run, away (the board's
        power-limited clock drifts by a few percent over a run), on the GPU that measures it."""
        for event in self.lanes.run(self.state.problems, _measure_baseline, every_lane=True):
            if isinstance(event, LaneLost):
                self._lose(event)
                continue
            if event.result is None:
                continue
            pp, base = event.task, event.result
            self.store.add(base, gpu=self.gpu, run_id=self.state.run_id, study=pp.study.study_name)
            pp.cublas_by_lane[event.lane] = base.tflops if base.status is Status.OK else None
        shown = min(i for i in range(len(self.lanes)) if i not in self.lanes.lost)
        for pp in self.state.problems:
            pp.cublas_tflops = pp.cublas_by_lane.get(shown)

    def _best_in_store(self) -> None:
        """Take as each problem's best the best in the store where it beats the one shown (found
        by an earlier run, or by another sweep on the store)."""
        for row in self.store.rows(["problem", "config_hash", "status", "tflops", "ratio"]):
            pp = next((q for q in self.state.problems if q.problem.name == row["problem"]), None)
            if pp is None or row["status"] != Status.OK.value or not row["config_hash"] or not row["ratio"]:
                continue
            if pp.best_ratio is None or row["ratio"] > pp.best_ratio * (1 + 1e-9):  # not our own again
                pp.best_ratio, pp.best_tflops, pp.best_at = row["ratio"], row["tflops"], None
                pp.best_config = self._config_for(row["config_hash"], pp.problem)

    def _lose(self, event: LaneLost) -> None:
        self.state.lost.append(event.reason)
        self.on_update(self.state)

    # ---- the loop -------------------------------------------------------------------------
    def run(self) -> SweepState:
        """Run until `settings.trials` configs are compiled (counting earlier runs), the
        timeout passes or the sampler runs out of new configs. Returns the final state.

        Other sweeps may run on the same store at once (other hosts): each claims a config in
        the store before compiling it, and one that another claimed first waits in its study
        for that sweep's results instead of being measured twice."""
        with self.store.running(self.state.run_id):
            return self._run()

    def _run(self) -> SweepState:
        start = time.monotonic()
        unfinished = self._load_previous()
        self._measure_baselines()
        self._best_in_store()
        seeds = seed_configs(self.space, self.store, [pp.problem for pp in self.state.problems],
                             self.gpu, self.bench.sm_count)
        # A seed goes to a study of its own types and layouts (its parameters say nothing of
        # them), the studies of each kind taking turns: the round robin asks each in turn.
        studies_of = collections.defaultdict(list)
        for pp in self.state.problems:
            studies_of[operand_kind(pp.problem)].append(pp)
        turns: collections.Counter = collections.Counter()
        for cfg in seeds:
            kind = operand_kind(cfg)
            if not studies_of[kind]:
                continue
            pp = studies_of[kind][turns[kind] % len(studies_of[kind])]
            turns[kind] += 1
            pcfg = config_of(params_of(cfg), pp.problem)
            if pcfg.hash in self.params[pp.problem].members and pcfg.hash not in self.in_study[pp.study.study_name]:
                pp.study.enqueue_trial(self.params[pp.problem].params(pcfg), skip_if_exists=True)
        self.on_update(self.state)

        def budget() -> int:  # configs another sweep holds will be compiled too
            return self.settings.trials - len(self.compiled_hashes | self.store.held_by_others(self.state.run_id))

        def timed_out() -> bool:
            return self.settings.timeout_s is not None and time.monotonic() - start > self.settings.timeout_s

        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        pending: dict[str, KernelConfig] = {}
        waiting: dict[str, list[tuple[ProblemProgress, optuna.Trial]]] = {}
        try:
            # Configs an interrupted run left part-measured go first, straight to the compiler (a
            # cache hit), asked by no study: as a seed, a study that holds the failed trial of the
            # interrupted run would skip it. `_finish` adds their results to every study.
            batch = []
            for cfg in unfinished:
                waiting[cfg.hash] = []
                if self.store.claim(cfg.hash, self.state.run_id):
                    self.elsewhere[cfg.hash] = cfg
                else:
                    pending[cfg.hash] = cfg
                    batch.append(cfg)
            room = min(self.settings.batch, budget())
            batch += self._propose(room, pending, waiting) if room > 0 else []
            future = pool.submit(self.compile, batch) if batch else None
            self.state.queued = len(batch)
            while future is not None:
                compiled = future.result()
                self._absorb_store()  # what another sweep on this store measured meanwhile
                before = len(self.compiled_hashes)
                self.compiled_hashes.update(k.config.hash for k in compiled)
                self.state.compiled = len(self.compiled_hashes)
                batch = [] if timed_out() else self._settle_elsewhere(pending, waiting)
                room = min(self.settings.batch, budget()) - len(batch)
                batch += [] if timed_out() or room <= 0 else self._propose(room, pending, waiting)
                future = pool.submit(self.compile, batch) if batch else None
                self.state.queued = len(batch)
                if compiled:
                    self._measure_baselines()
                self._measure_batch(compiled, before, pending, waiting)
                if future is None and self.elsewhere and not timed_out():
                    # Last, what other sweeps finished meanwhile, or gave up unfinished.
                    self._absorb_store()
                    batch = self._settle_elsewhere(pending, waiting)
                    future = pool.submit(self.compile, batch) if batch else None
                    self.state.queued = len(batch)
            self._absorb_store()
            self._best_in_store()  # another sweep on the store may have found a better one
            self.state.stop_reason = ("timeout" if timed_out() else
                                      "trial budget reached" if budget() <= 0 else "no new configs proposed")
        finally:
            # Trials still waiting (interrupt, or another sweep still measuring their configs) are
            # failed so a resumed run does not wait on them; the other sweep adds its results to
            # every study when it has them (`_finish`).
            self.state.elsewhere = len(self.elsewhere)
            for cfg_hash, items in waiting.items():
                for pp, trial in items:
                    with contextlib.suppress(Exception):
                        if cfg_hash in self.elsewhere:
                            trial.set_user_attr("config_hash", cfg_hash)
                            trial.set_user_attr("config", self.elsewhere[cfg_hash].name)
                            trial.set_user_attr("reason", "measured by another sweep on the store")
                        pp.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            pool.shutdown(wait=False, cancel_futures=True)
        self.on_update(self.state)
        return self.state
