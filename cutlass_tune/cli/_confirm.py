"""`cutlass-tune confirm`: re-measure each problem's leading kernels in several passes."""

from __future__ import annotations

import collections
import fnmatch
from pathlib import Path

import typer
from rich.table import Table

from .. import compile as compile_stage  # called through the module: a test's patch reaches here
from ..errors import CutlassTuneError
from ..measurement import TimingMethod
from ..regime import SUSTAINED, RegimeSpec
from ..status import Status
from ..store import open_store, resolve_storage
from ._console import figure, out, progress
from ._options import CACHE_DIR, GPU, JOBS, READ_DEFAULT
from ._timing import CONFIRM_METHOD, timing_options


def confirm(
    storage: str | None = typer.Option(None, "--storage", help=f"store URL or .sqlite file ({READ_DEFAULT})"),
    top: int = typer.Option(3, "--top", min=1, help="candidates per problem: the best kernel variants by sweep ratio"),
    passes: int = typer.Option(3, "--passes", min=1, help="times each candidate is measured"),
    gpu: int = GPU,
    jobs: int | None = JOBS,
    cache_dir: Path | None = CACHE_DIR,
    method: TimingMethod = CONFIRM_METHOD,
    problem: list[str] = typer.Option(
        [], "--problem", help="confirm only the problems whose name matches this shell pattern (repeatable), "
        "e.g. '16x*' or '*scale-blockwise'"),
    regime: list[str] = typer.Option(
        [], "--regime", help="the timing regime (repeatable, each in turn; default sustained): sustained (back to "
        "back, at the power cap), idle-gap:200us (an idle gap after each call), interleaved:64MiB (a memory copy "
        "between calls), as-captured:0.7:150us (a model step's busy fraction and gap length)"),
) -> None:
    """Re-measure each problem's leading kernels in several passes, into the same store;
    `best` then ranks confirmed problems by the median confirmed ratio (a sweep's best is the
    largest of many noisy medians and reads high). With `--regime`, the passes run once per
    regime: sustained passes rank a problem, the others give its ratio, SM clock and power in
    their regime (`best`, the dashboard and exported tables show them)."""
    # optuna with the search stage, torch with the GPU stage: only the commands that measure import
    # them, torch (1.5 s) once the store has been read, so a store that cannot be read fails first.
    from ..search import candidates
    from ..search import confirm as confirm_run

    specs = list(dict.fromkeys(RegimeSpec.parse(r).for_bench() for r in regime)) or [SUSTAINED]
    if method is not TimingMethod.SUSTAINED and specs != [SUSTAINED]:
        raise CutlassTuneError(f"--regime {specs[-1].name} is a setting of the sustained method, not --method "
                               f"{method.value}")
    store = open_store(resolve_storage(storage))
    chosen = candidates(store, top)
    if not chosen:
        raise CutlassTuneError(f"store {store.shown} has no successful kernel measurement to confirm")
    chosen = _matching(chosen, problem, store.shown)
    from ..bench import WorkerBenchmarker, regime_options

    bench = WorkerBenchmarker(gpu)
    try:
        timing = timing_options(method, None, store.timing())  # paired like the store's ratios
        cache = compile_stage.KernelCache.at(cache_dir)
        problems = len({c.problem for c in chosen})
        for spec in specs:
            bench.timing = timing if spec == SUSTAINED else regime_options(timing, spec)
            out.print(f"{store.shown}: {len(chosen)} candidates on {problems} problems, {passes} passes; "
                      f"{bench.gpu_name} ({bench.scheme}, regime {spec.name})")
            with progress("measuring", passes * (problems + len(chosen))) as advance:
                result = confirm_run(store, chosen,
                                     lambda cfgs: compile_stage.compile_kernels(cfgs, cache=cache, jobs=jobs),
                                     bench, passes, on_measurement=advance)
            _show(chosen, result)
            failed = collections.Counter(m.status.value for m, _ in result.rows if m.status is not Status.OK)
            out.print(f"run {result.run_id} (regime {spec.name}): {len(result.rows)} measurements added to "
                      f"{store.shown}" + (f"; not ok: {dict(failed)}" if failed else ""))
            for line in failures(result.rows):
                out.print(line, markup=False, highlight=False)
    finally:
        bench.close()


def failures(rows: list) -> list[str]:
    """One line per distinct failure of a confirm run's measurements (problem, the kernel or the
    torch baseline measured, status and the first line of its reason, with how many passes met
    it): a count alone hid why the torch side of a grouped problem failed in a regime."""
    seen: collections.Counter = collections.Counter()
    for m, _ in rows:
        if m.status is not Status.OK:
            what = f"{m.kernel_name} (torch's side)" if m.is_baseline else f"{m.kernel_name} {m.runtime.name}"
            reason = (m.reason.strip().splitlines() or ["no reason recorded"])[0][:300]
            seen[(m.problem.name, what, m.status.value, reason)] += 1
    return [f"  {status}: {problem} {what} ({n}x): {reason}" for (problem, what, status, reason), n in seen.items()]


def _matching(chosen: list, patterns: list[str], shown: str) -> list:
    """The candidates whose problem name matches one of `patterns` (all of them where none is
    given); an error naming a few of the store's problems where none matches."""
    if not patterns:
        return chosen
    kept = [c for c in chosen if any(fnmatch.fnmatchcase(c.problem.name, p) for p in patterns)]
    if not kept:
        names = sorted({c.problem.name for c in chosen})
        given = ", ".join(repr(p[:60]) for p in patterns[:4])
        raise CutlassTuneError(f"no problem of {shown} matches --problem {given} (its problems: "
                               f"{', '.join(names[:3])}{', ...' if len(names) > 3 else ''})")
    return kept


def _show(chosen: list, result) -> None:
    """Each candidate's sweep ratio beside the median and range of its confirmed passes, and the
    median of its ratios to the strongest torch path of each pass (the one `best` ranks by)."""
    ratios, medians, strongest = result.ratios(), result.medians(), result.strongest_medians()
    conditions = result.conditions()
    table = Table("problem", "kernel", "run-time", "sweep", "confirmed (median)", "passes", "low-high",
                  "to the strongest torch path", "SM MHz", "W", box=None, pad_edge=False)
    for c in chosen:
        key = (c.problem.name, c.config.name, c.runtime.name)
        got = ratios.get(key, [])
        table.add_row(c.problem.name, c.config.name, c.runtime.name, f"{c.ratio:.3f}",
                      f"{medians[key]:.3f}" if got else "failed", str(len(got)),
                      f"{min(got):.3f}-{max(got):.3f}" if got else "",
                      f"{strongest[key]:.3f}" if key in strongest else "",
                      figure(conditions.get(key, (None, None))[0], ".0f"),
                      figure(conditions.get(key, (None, None))[1], ".0f"))
    out.print(table)
