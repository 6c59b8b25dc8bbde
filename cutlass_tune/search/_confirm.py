"""Confirming a sweep's winners: re-measure the leading candidates of each problem in passes.

A sweep's best ratio is the largest of many noisy medians, so it is biased upwards: re-measured
on its own, a winner reads 0.1-2.5% lower (benchmarks/beat_cublas.md). `confirm` takes the
`top` best kernels of each problem (each with its best run-time variant) from the store and
measures them again, `passes` times, each pass with a fresh baseline per problem and the candidates in
alternating order. The rows go to the same store under the study name `CONFIRM_STUDY`;
`load_best` then ranks a confirmed problem by the median of its confirmed ratios.

This module never imports GPU code: the compiler and the benchmarker are passed in.
"""

from __future__ import annotations

import dataclasses
import statistics
import uuid
from collections.abc import Callable, Sequence

from ..compile import CompiledKernel
from ..measurement import Measurement
from ..space import KernelConfig, Problem, RuntimeArgs
from ..status import Status
from ..store import CONFIRM_STUDY, TUNE_MODEL_STUDY, ResultStore
from ._sweep import Benchmarker


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One (config, run-time variant) to re-measure on `problem`, with its sweep ratio."""

    problem: Problem
    config: KernelConfig
    runtime: RuntimeArgs
    ratio: float


@dataclasses.dataclass
class ConfirmResult:
    """What a confirmation run measured: every row it stored, in order, with its ratio to
    cuBLAS (its paired baseline, else the pass's baseline of its problem; None for failures)."""

    run_id: str
    rows: list[tuple[Measurement, float | None]] = dataclasses.field(default_factory=list)

    def ratios(self) -> dict[tuple[str, str, str], list[float]]:
        """(problem, kernel, run-time name) -> the ratio of each pass that measured it OK."""
        out: dict[tuple[str, str, str], list[float]] = {}
        for m, ratio in self.rows:
            if not m.is_baseline and ratio is not None:
                out.setdefault((m.problem.name, m.kernel_name, m.runtime.name), []).append(ratio)
        return out

    def medians(self) -> dict[tuple[str, str, str], float]:
        """(problem, kernel, run-time name) -> the median of its passes' ratios (of an even
        count, the mean of the middle two)."""
        return {key: statistics.median(got) for key, got in self.ratios().items()}

    def strongest_ratios(self) -> dict[tuple[str, str, str], list[float]]:
        """(problem, kernel, run-time name) -> its ratio to the strongest torch path of each pass
        that measured it and its baseline OK (`Measurement.to_strongest`: for a fused problem the
        fastest of eager, torch.compile and cuBLASLt's epilogue; else the ratio itself)."""
        rows = {(m.problem.name, m.repeat): m for m, _ in self.rows if m.is_baseline}
        out: dict[tuple[str, str, str], list[float]] = {}
        for m, ratio in self.rows:
            base = rows.get((m.problem.name, m.repeat))
            found = None if m.is_baseline or ratio is None or base is None else base.to_strongest(ratio)
            if found is not None:
                out.setdefault((m.problem.name, m.kernel_name, m.runtime.name), []).append(found[1])
        return out

    def conditions(self) -> dict[tuple[str, str, str], tuple[float | None, float | None]]:
        """(problem, kernel, run-time name) -> the median SM clock (MHz) and board power (W) of
        its passes, each None where no pass reported it (single launches, no NVML)."""
        found: dict[tuple[str, str, str], tuple[list[float], list[float]]] = {}
        for m, ratio in self.rows:
            if not m.is_baseline and ratio is not None:
                clocks, power = found.setdefault((m.problem.name, m.kernel_name, m.runtime.name), ([], []))
                clocks.extend([m.sm_mhz] if m.sm_mhz is not None else [])
                power.extend([m.power_w] if m.power_w is not None else [])
        return {key: (statistics.median(c) if c else None, statistics.median(w) if w else None)
                for key, (c, w) in found.items()}

    def strongest_medians(self) -> dict[tuple[str, str, str], float]:
        """The median of `strongest_ratios` per candidate: the figure `load_best` ranks by."""
        return {key: statistics.median(got) for key, got in self.strongest_ratios().items()}


def candidates(store: ResultStore, top: int) -> list[Candidate]:
    """Per problem of the store, its `top` best kernels by their best sweep ratio, best first,
    each with the run-time variant that reached it (distinct kernels: the question is which
    config to ship, and a kernel's variants are usually within noise of each other).
    Confirmation rows and `tune-model`'s in-model rows do not rank, and a kernel that ever gave a
    wrong result on a problem, with any variant, is never its candidate."""
    best: dict[tuple[str, str, str], Candidate] = {}
    wrong: set[tuple[str, str]] = set()
    for row, m in zip(store.rows(["study", "ratio", "status"]), store.measurements()):
        if m.is_baseline or m.config is None:
            continue
        key = (m.problem.name, m.config.hash, m.runtime.name)
        if m.status is Status.WRONG_RESULT:
            wrong.add(key[:2])
        if row.study in (CONFIRM_STUDY, TUNE_MODEL_STUDY) or m.status is not Status.OK or not row.ratio:
            continue
        if key not in best or row.ratio > best[key].ratio:
            best[key] = Candidate(problem=m.problem, config=m.config, runtime=m.runtime, ratio=row.ratio)
    by_kernel: dict[tuple[str, str], Candidate] = {}
    for key, cand in best.items():
        if key[:2] not in wrong and (key[:2] not in by_kernel or cand.ratio > by_kernel[key[:2]].ratio):
            by_kernel[key[:2]] = cand
    by_problem: dict[str, list[Candidate]] = {}
    for cand in by_kernel.values():
        by_problem.setdefault(cand.problem.name, []).append(cand)
    return [c for group in by_problem.values() for c in sorted(group, key=lambda c: -c.ratio)[:top]]


def confirm(store: ResultStore, chosen: Sequence[Candidate], compile_: Callable[[Sequence[KernelConfig]],
            list[CompiledKernel]], bench: Benchmarker, passes: int,
            on_measurement: Callable[[Measurement], None] = lambda m: None) -> ConfirmResult:
    """Measure `chosen` `passes` times into `store` (study `CONFIRM_STUDY`, one new run id).

    Each pass measures, per problem, cuBLAS first and then the problem's candidates, in the
    order of the ranking on even passes and reversed on odd ones. A kernel that no longer
    compiles is recorded once per problem with its reason. Every row is committed as it is
    taken, so an interrupted run keeps what it measured (`load_best` ranks a candidate only if
    it has at least half as many confirmed passes as its problem's most confirmed one).

    The bench's timing method may differ from the sweep's: each row records its method, and
    `load_best` ranks a problem by the confirm passes of one method (see `report.RANKING`). Its
    timing regime too (`TimingOptions.regime`, recorded by the bench on each row): rows of another
    regime than back to back give the chosen kernel's figures in that regime, never the choice.

    Raises:
        StoreError: the store holds another GPU's results.
    """
    store.bind_gpu(bench.gpu_name)
    result = ConfirmResult(run_id=f"confirm-{uuid.uuid4().hex[:8]}")
    configs = {c.config.hash: c.config for c in chosen}
    kernels = {k.config.hash: k for k in compile_(list(configs.values()))}
    problems: dict[str, list[Candidate]] = {}
    for c in chosen:
        problems.setdefault(c.problem.name, []).append(c)

    def keep(m: Measurement, cublas_tflops: float | None = None) -> None:
        store.add(m, gpu=bench.gpu_name, run_id=result.run_id, cublas_tflops=cublas_tflops, study=CONFIRM_STUDY)
        base = m.baseline_tflops or cublas_tflops
        ok = m.status is Status.OK and not m.is_baseline
        result.rows.append((m, m.tflops / base if ok and m.tflops and base else None))
        on_measurement(m)

    for group in problems.values():
        for c in group:
            k = kernels[c.config.hash]
            if k.status is not Status.OK:
                keep(Measurement(problem=c.problem, config=c.config, runtime=c.runtime, status=k.status,
                                 reason=k.reason, compile_seconds=k.seconds))
    for rep in range(passes):
        for group in problems.values():
            usable = [c for c in group if kernels[c.config.hash].status is Status.OK]
            if not usable:
                continue
            base = dataclasses.replace(bench.baseline(group[0].problem), repeat=rep)
            keep(base)
            cublas = base.tflops if base.status is Status.OK else None
            for c in (usable if rep % 2 == 0 else usable[::-1]):
                for m in bench.measure(kernels[c.config.hash], c.problem, [c.runtime]):
                    keep(dataclasses.replace(m, repeat=rep), cublas)
    return result
