"""In-model tuning: choose each GEMM's kernel by its time inside the user's model step.

A table's kernels were chosen in an isolated loop; inside a model they run at other clocks,
between other kernels (benchmarks/regimes.md). `tune-model` runs the model's own step with the
table's leading candidates per GEMM problem and keeps, per problem, the candidate fastest there,
or torch's path where torch is faster there. This module holds its decisions and never touches
the GPU (bench/_in_model.py runs the steps):

- `covered`: the problems of the table the model runs (the capture's problems looked up as the
  dispatcher looks them up), each with its candidates: torch's path first, then the leading
  kernel variants (a store's, by confirmed ratio; else the table's row alone).
- `schedule`: candidate i of every problem in step i (all problems at once, so the step count is
  the candidates' count); a problem with fewer candidates runs its table row again. Step 0 is
  torch's path for every problem, run on a table without rows: a dense problem whose row is
  missing would take the nearest tuned problem's kernel, not torch's (`BestTable.find`). An fp8
  kernel with fast accumulation keeps its row there, held below any `min_ratio` (`TORCH_HELD`):
  torch's path is then torch._scaled_mm with fast accumulation, the one the kernel was measured
  against (without a row the dispatcher runs it without, 5-10% slower at M 2048).
- `step_frame`: the table a step runs: the full table with each covered problem's row replaced
  by its candidate of the step, held above any `min_ratio` (`HELD`) so that the dispatcher runs it.
- `kernel_times`: the profiler's events of the steps, attributed to problems by the ranges the
  doors open while a profiler runs (`RANGE_PREFIX` + the problem's name) inside each step's range
  (`STEP_PREFIX` + its index); each range's GPU kernel time is summed per problem per step.
- `step_split`: a profiled step's kernel time split into GEMM kernels (by name: the product's,
  cuBLAS's, torch's grouped and Inductor's template GEMMs) and the rest, for the A/B's account of
  where a step's gain comes from (`GainSplit`: the GEMMs, the other kernels, host time and gaps).
- `choose`, `tuned_frame`: per problem the candidate of least median time, torch's path where
  torch's is as fast or faster (a tie keeps torch: no gain for a kernel's risk), and the table
  with each covered row the best kernel's, its `in_model_ratio` torch's time over the kernel's
  (below 1 where torch was kept, so the dispatcher keeps torch: `Match.dispatch_ratio`), with the
  in-model regime it ran in and the board's SM clock and power meanwhile (`InModelRun`).
- `in_model_measurements`, `record`: the same figures as a store's measurements (regime
  `in-model:...`, study `TUNE_MODEL_STUDY`), written in one transaction: per problem each kernel
  candidate's time per call, paired with torch's path's of the same steps, and torch's as the
  problem's baseline row; `report.load_best` then chooses from them as `tuned_frame` does.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pandas as pd

from ..errors import CutlassTuneError
from ..measurement import Baseline, EnvStamp, Measurement
from ..regime import Regime, RegimeSpec
from ..space import Problem, RuntimeArgs
from ..status import Status
from ..store import TUNE_MODEL_STUDY, ResultStore
from ..tables import PROFILER_RANGE, BestTableError

if TYPE_CHECKING:
    from ..runtime import BestTable

TORCH = "torch"
"""The label of torch's own path, the first candidate of every problem."""
STEP_PREFIX = "cutlass_tune.step:"
"""The profiler range of one step: this prefix and the step's index."""
RANGE_PREFIX = PROFILER_RANGE
"""The profiler range a door opens around one GEMM call while a profiler runs: this prefix and the
problem's name (runtime: `grouped_mm`, `matmul`)."""
HELD = 1.0e6
"""The `in_model_ratio` of a candidate's row in a step's table: above any `min_ratio`, so the
dispatcher runs the candidate whatever its claim (step tables are never written)."""


TORCH_HELD = 0.0
"""The `in_model_ratio` of an fp8 fast-accumulation row in torch's step: below any `min_ratio`, so
the dispatcher runs torch's path with the row's accumulation (Fp8Linear and `matmul` hold their
calls to a `min_ratio` of 1)."""


class InModelError(CutlassTuneError):
    """A model and table `tune-model` cannot tune: no problem in common, no step timed."""


@dataclasses.dataclass(frozen=True, eq=False)
class Candidate:
    """One way to run a problem: torch's path (`row` None) or a kernel variant (its table row)."""

    label: str
    row: pd.Series | None = None

    @property
    def is_torch(self) -> bool:
        return self.row is None


@dataclasses.dataclass(frozen=True, eq=False)
class Covered:
    """A problem of the table that the model runs, and the candidates timed for it."""

    problem: str
    """The table's problem name (its row's `problem`)."""
    names: frozenset[str]
    """The names of the problems the model's calls pose that the table answers with this row (what
    the doors' profiler ranges carry)."""
    candidates: tuple[Candidate, ...]
    """torch's path first, then the kernel variants, best claim first."""


def _label(row: pd.Series) -> str:
    return f"{row['kernel']} {row['runtime']}"


def covered(table: BestTable, captured: Iterable[Problem], leading: pd.DataFrame | None = None,
            top: int = 3) -> list[Covered]:
    """The table's problems that `captured` (a model's problems, `Capture.problems()`) reaches.

    A captured problem reaches the row the dispatcher would run for it: the same operation and
    sizes (a grouped one: the same experts, N and K at the nearest routed rows, as `BestTable.find`
    looks it up); a single GEMM only its exact row (a nearest one was tuned for another problem).

    Args:
        table: the table (one GPU model's rows).
        captured: the model's problems.
        leading: a store's leading variants per problem (`report.load_candidates`), best first;
            None: the table's row is the problem's one kernel candidate.
        top: kernel candidates per problem at most.

    Raises:
        InModelError: none of the model's problems is in the table (one line naming both sides).
    """
    found: dict[str, set[str]] = {}
    for p in captured:
        try:
            match = table.find(p.m, p.n, p.k, p.operation, groups=p.groups)
        except BestTableError:
            continue
        if match.exact or p.grouped:
            found.setdefault(str(match.row["problem"]), set()).add(p.name)
    if not found:
        asked = sorted({p.name for p in captured})
        raise InModelError(f"the table has none of the model's {len(asked)} GEMM problems "
                           f"({', '.join(asked[:4])}{' ...' if len(asked) > 4 else ''}); "
                           f"it has: {', '.join(sorted(set(table.frame['problem']))[:4]) or 'none'}")
    frame = table.frame
    out = []
    for problem, names in found.items():
        rows = [r for _, r in frame[frame["problem"] == problem].iterrows()][:1]
        if leading is not None and not leading.empty:
            same = leading[(leading["problem"] == problem) & leading["gpu"].isin(set(frame["gpu"]))]
            seen = {(rows[0]["config_hash"], rows[0]["runtime"])}
            for _, r in same.iterrows():
                if (r["config_hash"], r["runtime"]) not in seen:
                    seen.add((r["config_hash"], r["runtime"]))
                    rows.append(r)
        kernels = tuple(Candidate(_label(r), r) for r in rows[:max(1, top)])
        out.append(Covered(problem, frozenset(names), (Candidate(TORCH), *kernels)))
    return out


def schedule(problems: Sequence[Covered]) -> list[dict[str, Candidate]]:
    """The steps of one round: step i runs candidate i of every problem (its table row, candidate
    1, where it has fewer); step 0 is torch's path for all."""
    steps = max(len(c.candidates) for c in problems)
    return [{c.problem: c.candidates[i] if i < len(c.candidates) else c.candidates[1] for c in problems}
            for i in range(steps)]


def _fast_accumulating(row: pd.Series) -> bool:
    """A dense fp8 row-wise (or per-tensor) kernel with fast accumulation: torch's path it was
    measured against is torch._scaled_mm with fast accumulation, which the dispatcher runs where
    the row is held below `min_ratio`, not where there is no row."""
    return (str(row.get("fp8_fast_accum", "")).lower() == "true" and str(row.get("scaling", "")) != "blockwise"
            and str(row.get("grouping", "none")) in ("none", "nan", ""))


def step_frame(frame: pd.DataFrame, step: Mapping[str, Candidate]) -> pd.DataFrame:
    """The table a step runs: `frame` with each problem of `step` holding its candidate's row (at
    `HELD`). A step of torch's path for every problem holds no row (see the module) but the rows of
    fp8 kernels with fast accumulation, held at `TORCH_HELD`: torch._scaled_mm then runs with fast
    accumulation, as the kernels were measured against (without a row, it runs without)."""
    if all(c.is_torch for c in step.values()):
        fast = frame[frame["problem"].isin(set(step)) & frame.apply(_fast_accumulating, axis=1)].copy() \
            if len(frame) else frame.iloc[:0].copy()
        fast["in_model_ratio"] = TORCH_HELD
        return fast
    kept = frame[~frame["problem"].isin(set(step))]
    rows = [c.row.copy() for c in step.values() if c.row is not None]
    for row in rows:
        row["in_model_ratio"] = HELD
    out = pd.concat([kept, pd.DataFrame(rows)], ignore_index=True)
    return out[list(frame.columns)] if set(frame.columns) <= set(out.columns) else out


class EventLike(Protocol):
    """What `kernel_times` reads of a profiler event (torch's `FunctionEvent`): a CPU event with
    its children and the kernels the profiler linked to it, or a GPU kernel (`device_type` CUDA)
    under the CUPTI correlation id (`id`) of the runtime call that launched it."""

    name: str
    id: int
    kernels: Sequence[Any]
    cpu_children: Sequence[Any]
    cpu_parent: Any


_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel", "cudaLaunchKernelExC",
             "cuLaunchKernelEx")
"""The runtime calls that launch a kernel, as CUPTI names them (a kernel launched through ctypes is
linked to its launch by correlation id, not always to the range around it)."""


def _is_gpu(event: Any) -> bool:
    return str(getattr(event, "device_type", "")).endswith("CUDA")


def _is_kernel(event: Any) -> bool:
    """A GPU kernel, not a range: a profiler range open around a launch shows on the GPU as a user
    annotation spanning its kernels (counted, the kernels would count twice)."""
    return _is_gpu(event) and not getattr(event, "is_user_annotation", False)


def _gpu_us(event: Any) -> float:
    span = event.time_range
    return float(span.end - span.start)


def _subtree(event: EventLike) -> Iterable[EventLike]:
    yield event
    for child in event.cpu_children:
        yield from _subtree(child)


def _kernel_us(event: EventLike, launched: Mapping[int, float]) -> float:
    """The GPU kernel time launched within `event` and the events under it: the kernels of the
    launch calls in it, by correlation id, where the profile has them; else the kernels the
    profiler linked to its events."""
    tree = list(_subtree(event))
    by_launch = [launched[e.id] for e in tree if e.name.startswith(_LAUNCHES) and e.id in launched]
    if by_launch:
        return sum(by_launch)
    return sum(float(k.duration) for e in tree for k in e.kernels)


def _ranges(event: EventLike) -> Iterable[EventLike]:
    """The door ranges under `event` (not under another door range)."""
    for child in event.cpu_children:
        if child.name.startswith(RANGE_PREFIX):
            yield child
        else:
            yield from _ranges(child)


def _doors(events: Sequence[EventLike], names: Mapping[str, str]) -> Iterable[tuple[int, str, EventLike]]:
    """(step index, table problem, door range) of each door range of a covered problem in a step."""
    for event in events:
        if _is_gpu(event) or event.cpu_parent is not None or not event.name.startswith(STEP_PREFIX):
            continue
        index = int(event.name[len(STEP_PREFIX):])
        yield index, "", event  # the step itself: a step without a covered call still counts
        for door in _ranges(event):
            problem = names.get(door.name[len(RANGE_PREFIX):])
            if problem is not None:
                yield index, problem, door


def kernel_times(events: Iterable[EventLike], names: Mapping[str, str]) -> dict[int, dict[str, float]]:
    """Per step index, per table problem, the GPU kernel microseconds of its calls in that step.

    Args:
        events: the profiler's events (`prof.events()`): steps' ranges at the top, GPU kernels
            among them.
        names: the problem names the doors' ranges carry -> the table's problem (`Covered.names`);
            a range of another name (a GEMM the table does not cover) is left out.
    """
    events = list(events)
    launched = {int(e.id): _gpu_us(e) for e in events if _is_kernel(e)}
    out: dict[int, dict[str, float]] = {}
    for index, problem, door in _doors(events, names):
        step = out.setdefault(index, {})
        if problem:
            step[problem] = step.get(problem, 0.0) + _kernel_us(door, launched)
    return out


def call_counts(events: Iterable[EventLike], names: Mapping[str, str]) -> dict[int, dict[str, int]]:
    """Per step index, per table problem, how many calls of it the step made (its door ranges,
    as `kernel_times` reads them): a model calls one problem once per layer, and `kernel_times`
    sums them."""
    out: dict[int, dict[str, int]] = {}
    for index, problem, _ in _doors(list(events), names):
        step = out.setdefault(index, {})
        if problem:
            step[problem] = step.get(problem, 0) + 1
    return out


def kernel_spans(events: Iterable[Any]) -> list[tuple[float, float]]:
    """The GPU kernels' (start, end) in microseconds, from the profiler's events."""
    return [(float(e.time_range.start), float(e.time_range.end)) for e in events if _is_kernel(e)]


def duty_cycle(spans: Iterable[tuple[float, float]]) -> RegimeSpec | None:
    """The steps' duty cycle as the as-captured regime (`RegimeSpec.as_captured`): the fraction of
    the time from the first kernel's start to the last one's end that some kernel runs, and the
    mean idle gap between kernels; None for no kernels or a GPU never idle."""
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    if len(merged) < 2:
        return None
    busy = sum(end - start for start, end in merged) / (merged[-1][1] - merged[0][0])
    gaps = [b[0] - a[1] for a, b in zip(merged, merged[1:])]
    if round(busy, 3) >= 1:
        return None
    return RegimeSpec.as_captured(busy=round(busy, 3), gap_us=max(0.1, round(statistics.mean(gaps), 1)))


_GEMM_KERNEL = re.compile(r"gemm|xmma|nvjet|PtrArray|GroupProblemShape|grouped_mm|build_group_arguments|triton_tem_",
                          re.IGNORECASE)
"""GEMM kernels by name: CUTLASS's (`cutlass::gemm::kernel::...`, the product's and torch's grouped
GEMM), cuBLAS's (`sm90_xmma_gemm_...`, `nvjet_...`), the product's grouped arguments builder and
Inductor's template GEMMs (`triton_tem_fused_mm...`). The product's MoE glue kernels
(`cutlass_tune::...gather_kernel`, `combine_kernel`) are not GEMMs."""


def is_gemm_kernel(name: str) -> bool:
    """Whether a GPU kernel of this name is a GEMM (`_GEMM_KERNEL`)."""
    return bool(_GEMM_KERNEL.search(name))


@dataclasses.dataclass(frozen=True)
class StepSplit:
    """One profiled step's GPU kernel time, microseconds: its GEMM kernels' and the rest's."""

    gemm_us: float
    other_us: float

    @property
    def kernels_us(self) -> float:
        return self.gemm_us + self.other_us


def step_split(events: Iterable[Any], steps: int = 1) -> StepSplit:
    """The kernel time per step of `steps` profiled steps' events, GEMMs apart (`is_gemm_kernel`)."""
    gemm = other = 0.0
    for event in events:
        if _is_kernel(event):
            if is_gemm_kernel(event.name):
                gemm += _gpu_us(event)
            else:
                other += _gpu_us(event)
    return StepSplit(gemm / steps, other / steps)


@dataclasses.dataclass(frozen=True)
class GainSplit:
    """Where one step's time differs from another's, milliseconds (positive: the other step is
    slower): the GEMM kernels, the other kernels, and the rest of the step (host time the GPU
    waits on, gaps between kernels), the step times' difference less the kernels'."""

    total_ms: float
    gemm_ms: float
    other_kernels_ms: float

    @property
    def host_and_gaps_ms(self) -> float:
        return self.total_ms - self.gemm_ms - self.other_kernels_ms

    @classmethod
    def of(cls, ours_ms: float, ours: StepSplit, theirs_ms: float, theirs: StepSplit) -> GainSplit:
        return cls(theirs_ms - ours_ms, (theirs.gemm_us - ours.gemm_us) / 1e3,
                   (theirs.other_us - ours.other_us) / 1e3)


@dataclasses.dataclass(frozen=True)
class InModelRun:
    """Where one token count's candidates were timed: the in-model regime (`RegimeSpec.in_model`:
    the step's mode and token count), and the board's median SM clock and mean power over the
    profiled rounds (NaN where NVML does not report them)."""

    regime: RegimeSpec
    sm_mhz: float = math.nan
    power_w: float = math.nan

    def __post_init__(self) -> None:
        assert self.regime.regime is Regime.IN_MODEL, "tune-model's figures are of the in-model regime"


@dataclasses.dataclass(frozen=True)
class Choice:
    """A problem's in-model figures and what is kept."""

    problem: str
    times_us: Mapping[str, float]
    """Per candidate label, its median kernel time per step inside the model."""
    samples: int
    """Steps per candidate (the fewest)."""
    best: Candidate
    """The fastest kernel candidate."""
    kept: Candidate
    """`best`, or torch's path where torch is as fast or faster."""
    steps_us: Mapping[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)
    """Per candidate label, its kernel time in each step that ran it."""
    calls: int = 1
    """The problem's calls per step (the median over the steps; the times are their sum)."""
    run: InModelRun | None = None
    """Where it was timed (None: not said)."""
    candidates: tuple[Candidate, ...] = ()
    """Every candidate timed, torch's path first (`Covered.candidates`)."""

    @property
    def ratio(self) -> float:
        """torch's time over the best kernel's: the row's `in_model_ratio`."""
        return self.times_us[TORCH] / self.times_us[self.best.label]


def choose(problems: Sequence[Covered], steps: Sequence[Mapping[str, Candidate]],
           times: Mapping[int, Mapping[str, float]], *, calls: Mapping[int, Mapping[str, int]] | None = None,
           run: InModelRun | None = None) -> list[Choice]:
    """Per problem, the median in-model time of each candidate over the steps that ran it, and the
    candidate kept (see the module).

    Args:
        steps: the candidates of each step index (`schedule`, repeated over rounds).
        times: `kernel_times` of those steps.
        calls: `call_counts` of those steps (None: one call per step).
        run: where the steps ran, which each choice carries.

    Raises:
        InModelError: a candidate with no timed step (its kernel launched nothing the ranges saw).
    """
    out = []
    for c in problems:
        samples: dict[str, list[float]] = {}
        for index, step in enumerate(steps):
            us = times.get(index, {}).get(c.problem)
            if us is not None and us > 0:
                samples.setdefault(step[c.problem].label, []).append(us)
        missing = [k.label for k in c.candidates if k.label not in samples]
        if missing:
            raise InModelError(f"{c.problem}: no kernel time inside the model for {', '.join(missing)} "
                               "(its calls opened no profiler range with GPU work)")
        medians = {label: statistics.median(v) for label, v in samples.items()}
        kernels = [k for k in c.candidates if not k.is_torch]
        best = min(kernels, key=lambda k: medians[k.label])
        kept = best if medians[best.label] < medians[TORCH] else c.candidates[0]
        counted = [n for step in (calls or {}).values() if (n := step.get(c.problem))]
        out.append(Choice(c.problem, medians, min(len(v) for v in samples.values()), best, kept,
                          {label: tuple(v) for label, v in samples.items()},
                          max(1, round(statistics.median(counted))) if counted else 1, run, c.candidates))
    return out


_IN_MODEL = Regime.IN_MODEL.column


def tuned_frame(frame: pd.DataFrame, choices: Sequence[Choice]) -> pd.DataFrame:
    """`frame` with each chosen problem's row the best kernel's, its `in_model_ratio` set, and its
    `in_model_regime`, `in_model_sm_mhz` and `in_model_power_w` where the choice says where it ran
    (the other rows as they were)."""
    out = frame.copy()
    for what in ("ratio", "sm_mhz", "power_w"):
        column = f"{_IN_MODEL}_{what}"
        out[column] = (out[column] if column in out.columns else pd.Series(math.nan, index=out.index)).astype(float)
    regime = f"{_IN_MODEL}_regime"
    out[regime] = (out[regime].fillna("") if regime in out.columns else pd.Series("", index=out.index)).astype(object)
    for choice in choices:
        assert choice.best.row is not None  # a kernel candidate
        at = out.index[out["problem"] == choice.problem]
        row = choice.best.row.reindex(out.columns)
        row[f"{_IN_MODEL}_ratio"] = choice.ratio
        run = choice.run
        row[regime] = run.regime.name if run is not None else ""
        row[f"{_IN_MODEL}_sm_mhz"] = run.sm_mhz if run is not None else math.nan
        row[f"{_IN_MODEL}_power_w"] = run.power_w if run is not None else math.nan
        for i in at:
            out.loc[i] = row
    return out


Variant = tuple[str, str, str]
"""A kernel variant of a problem: (the table's problem name, config hash, run-time name)."""


def variant_of(row: pd.Series) -> Variant:
    """The variant a candidate's table row is."""
    return str(row["problem"]), str(row["config_hash"]), str(row["runtime"])


def stored_variants(store: ResultStore) -> dict[Variant, Measurement]:
    """Each kernel variant the store measured OK (a verified one: the bench verifies before it
    times; a store holds one GPU model's), as one of its measurements (the last): what the in-model
    figures of a candidate are recorded as (its problem, config and run-time arguments).

    Raises:
        StoreError: the store cannot be read.
    """
    out: dict[Variant, Measurement] = {}
    for row in store.rows(["problem", "config_hash", "runtime", "status", "record"]):
        if row.status is Status.OK and row.config_hash:
            out[(str(row.problem), row.config_hash, str(row.runtime))] = row.measurement()
    return out


def unstored(problems: Sequence[Covered], stored: Mapping[Variant, Measurement]) -> list[str]:
    """The kernel candidates of `problems` that `stored` lacks ("problem: kernel runtime"): their
    in-model figures could not be recorded."""
    return [f"{c.problem}: {k.label}" for c in problems for k in c.candidates
            if k.row is not None and variant_of(k.row) not in stored]


def _per_call_ms(steps_us: Sequence[float], calls: int) -> tuple[float, float, float]:
    """Median, p20 and p80 of one call's milliseconds, from its steps' summed microseconds."""
    ms = sorted(us / calls / 1000 for us in steps_us)
    if len(ms) == 1:
        return ms[0], ms[0], ms[0]
    q = statistics.quantiles(ms, n=5, method="inclusive")
    return statistics.median(ms), q[0], q[3]


def in_model_measurements(choices: Sequence[Choice], stored: Mapping[Variant, Measurement],
                          env: EnvStamp | None = None) -> list[Measurement]:
    """The choices' figures as measurements of the in-model regime: per problem, each kernel
    candidate's time per call (the problem's kernel time per step over its calls per step), paired
    with torch's path's of the same steps (`baseline_*`: its ratio is torch's time over its own,
    `Choice.ratio` for the best), and torch's path as the problem's baseline row. Each carries the
    regime's name, SM clock and power (`Choice.run`), and `env`.

    Args:
        stored: `stored_variants` of the store: a candidate's problem, config and run-time
            arguments come from its verified measurement there.

    Raises:
        InModelError: a choice without its run, or a kernel candidate `stored` lacks.
    """
    out = []
    for choice in choices:
        if choice.run is None:
            raise InModelError(f"{choice.problem}: the in-model choice does not say where it ran")
        run = choice.run
        sm_mhz, power_w = _figure(run.sm_mhz), _figure(run.power_w)
        torch_ms, torch_p20, torch_p80 = _per_call_ms(choice.steps_us[TORCH], choice.calls)
        problem = None
        for candidate in choice.candidates:
            if candidate.row is None or candidate.label not in choice.steps_us:
                continue
            source = stored.get(variant_of(candidate.row))
            if source is None:
                raise InModelError(f"{choice.problem}: {candidate.label} is not in the store: its in-model figures "
                                   "cannot be recorded")
            problem = source.problem
            steps = choice.steps_us[candidate.label]
            median, p20, p80 = _per_call_ms(steps, choice.calls)
            out.append(Measurement(
                problem=problem, config=source.config, runtime=source.runtime, status=Status.OK, median_ms=median,
                p20_ms=p20, p80_ms=p80, samples=len(steps), tflops=problem.flops / (median * 1e9),
                baseline_median_ms=torch_ms, baseline_p20_ms=torch_p20, baseline_p80_ms=torch_p80,
                sm_mhz=sm_mhz, power_w=power_w, baseline_sm_mhz=sm_mhz, baseline_power_w=power_w,
                regime=run.regime.name, env=env))
        if problem is not None:
            out.append(Measurement(
                problem=problem, config=None, runtime=RuntimeArgs(), status=Status.OK, is_baseline=True,
                symbol=Baseline.of(problem).value, median_ms=torch_ms, p20_ms=torch_p20, p80_ms=torch_p80,
                samples=len(choice.steps_us[TORCH]), tflops=problem.flops / (torch_ms * 1e9), sm_mhz=sm_mhz,
                power_w=power_w, regime=run.regime.name, env=env))
    return out


def _figure(value: float) -> float | None:
    return value if math.isfinite(value) else None


def record(store: ResultStore, measurements: Sequence[Measurement], gpu: str) -> str:
    """Add `measurements` (`in_model_measurements`) to `store` in one transaction, as one run of
    study `TUNE_MODEL_STUDY`; returns its run id.

    Raises:
        StoreError: the store cannot be written, or holds another GPU's results; it then holds
            none of them.
    """
    store.bind_gpu(gpu)
    run_id = f"tune-model-{uuid.uuid4().hex[:8]}"
    store.add_all(measurements, gpu=gpu, run_id=run_id, study=TUNE_MODEL_STUDY)
    return run_id
