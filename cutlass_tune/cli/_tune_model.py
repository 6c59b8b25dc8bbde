"""`cutlass-tune tune-model`: choose each GEMM's kernel by its time inside the model's own step."""

from __future__ import annotations

import math
import time
from pathlib import Path

import typer
from rich.table import Table

from ..errors import CutlassTuneError
from ..runtime import BestTable
from ._console import out
from ._options import GPU, check_output, user_output

ROUNDS = 5
"""Steps per candidate (the median is over them)."""


class TuneModelError(CutlassTuneError):
    """Options `tune-model` cannot run with."""


def tune_model(
    target: str = typer.Argument(..., metavar="FILE.py:FUNCTION",
                                 help="a Python file and a function in it that returns (model, example_inputs), "
                                 "as `shapes` takes it; with --tokens it is called as FUNCTION(tokens=N)"),
    table_source: str = typer.Option(..., "--table", help="best-config table file or bundle (as `BestTable.load` "
                                     "takes) whose problems the model runs"),
    tokens: list[int] = typer.Option(None, "--tokens", min=1, help="token counts to tune at, one run of the model "
                                     "each (repeat the option); default: the inputs FUNCTION() returns"),
    mode: str = typer.Option("eager", "--mode", help="eager, compiled (torch.compile of the model), or graphs "
                             "(the compiled step replayed from a CUDA graph in the A/B; candidates timed compiled)"),
    candidates: int = typer.Option(3, "--candidates", min=1, help="kernel candidates per problem at most (besides "
                                   "torch's path): the store's leading confirmed variants, else the table's row"),
    table_out: Path | None = typer.Option(
        None, "--out", callback=user_output, help="write the table with each tuned problem's in-model kernel, "
        "its in_model_ratio and the in-model regime, SM clock and power (.csv, .json or .parquet)"),
    storage: str | None = typer.Option(None, "--storage", help="the store the table came from: its leading "
                                       "variants per problem are the candidates, and the in-model figures are "
                                       "recorded there (regime in-model:MODE:TOKENS, all of a run or none), so "
                                       "that `best`, `export` and `BestTable.load` of the store choose by them"),
    rounds: int = typer.Option(ROUNDS, "--rounds", min=1, help="profiled steps per candidate"),
    blocks: int = typer.Option(10, "--blocks", min=0, help="A/B blocks per side (0: no A/B)"),
    baseline: str | None = typer.Option(
        None, "--baseline", metavar="FILE.py:FUNCTION", help="the same model on torch's own path (same weights and "
        "inputs; called as FUNCTION is): the A/B's torch side. Without it, torch's side is the model on a table "
        "without rows (torch's path through the product's doors)"),
    gpu: int = GPU,
) -> None:
    """Run the model's step with the table's leading candidates per GEMM problem, rotating them
    across steps on the same weights (candidate i of every problem in step i), time each
    candidate's kernels inside the step (torch.profiler's CUPTI kernel times, attributed to
    problems by the doors' profiler ranges; the board's SM clock and power read meanwhile), keep
    per problem the fastest there or torch's path where torch is as fast, write the table with
    `in_model_ratio` (the figure the dispatcher then holds `min_ratio` against) and record the
    figures in the store (`--storage`: `best` of the store then makes the same choice), and end
    with an A/B of the whole step at each token count: the
    in-model table against the input table and against torch (alternating blocks, CUDA events),
    each side's step then profiled for where the difference lies (GEMM kernels, other kernels,
    host time and gaps)."""
    began = time.perf_counter()
    from ..bench._in_model import Mode

    try:
        run_mode = Mode(mode)
    except ValueError:
        raise TuneModelError(f"--mode {mode!r}: use eager, compiled or graphs") from None
    fmt = _table_format(table_out)
    if table_out is not None:
        check_output(table_out, table_source)
    from ..bench._in_model import bind
    from ..search._in_model import covered

    table = BestTable.load(table_source)
    leading = store = None
    if storage is not None:
        from ..report import load_candidates
        from ..store import open_store

        store = open_store(storage)
        leading = load_candidates(storage, candidates)
    bind(table)  # the "cutlass_tune" experts of a model need a table, on the meta device too
    counts: list[int | None] = list(tokens) if tokens else [None]
    # Shapes first, on the meta device: a model or table that cannot be tuned says so without a GPU.
    plans = {n: covered(table, _captured(target, n, gpu).problems(), leading, candidates) for n in counts}
    stored = _stored(store, plans)
    import torch

    from ..bench import require_gpu

    require_gpu(gpu)
    torch.cuda.set_device(gpu)
    name = torch.cuda.get_device_name(gpu)
    mine = table.for_gpu(name)
    if mine.frame.empty:
        raise TuneModelError(f"{table_source} has no row tuned on this GPU ({name}; it has {', '.join(table.gpus)})")
    if store is not None and store.gpu() not in (None, name):
        raise TuneModelError(f"--storage {store.shown} holds results of {store.gpu()}, not of this GPU ({name})")
    _progress(began, f"captured the model's GEMMs: {sum(len(p) for p in plans.values())} problems of the table")
    choices: list = []
    steps = {}
    for n, problems in plans.items():
        found, steps[n] = _tune_at(target, n, mine, problems, run_mode, rounds, began, gpu)
        choices += found
    from ..search._in_model import tuned_frame

    tuned = tuned_frame(table.frame, choices)
    if store is not None:
        from ..bench import env_stamp
        from ..search._in_model import in_model_measurements, record

        measurements = in_model_measurements(choices, stored, env_stamp(gpu))
        run_id = record(store, measurements, name)
        out.print(f"recorded {len(measurements)} in-model measurements of {len(choices)} problems in {store.shown} "
                  f"(run {run_id}): `cutlass-tune best --storage {store.shown}` chooses by them")
    if table_out is not None:
        from ..report import write_table

        write_table(tuned, table_out, fmt, source=table_source)
        out.print(f"wrote {table_out}: in-model ratios of {len(choices)} problems")
    for n, step in steps.items() if blocks else ():
        where = f" at {n} tokens" if n else ""
        baseline_step = None
        if baseline is not None:
            from ..bench._in_model import build_step
            from ..capture import load_target

            _progress(began, f"building the baseline {baseline}{where}")
            baseline_step = build_step(load_target(baseline, _arguments(n)), run_mode, patched=False)
        _progress(began, f"A/B of the whole step{where}: {blocks} blocks a side")
        _ab(step, n, mine, BestTable(tuned, bundled=table.bundled).for_gpu(name), blocks, baseline_step,
            graphs=run_mode is Mode.GRAPHS)
    out.print(f"tune-model took {time.perf_counter() - began:.0f} s")


def _stored(store, plans: dict) -> dict:
    """The store's verified variants (`search._in_model.stored_variants`; {} without a store), after
    checking that it holds every kernel candidate: the in-model figures of one it lacks could not be
    recorded, so the run stops before the GPU does any work."""
    if store is None:
        return {}
    from ..search._in_model import stored_variants, unstored

    stored = stored_variants(store)
    missing = [m for problems in plans.values() for m in unstored(problems, stored)]
    if missing:
        raise TuneModelError(f"--storage {store.shown} lacks {len(missing)} of the candidates ({missing[0]}"
                             f"{', ...' if len(missing) > 1 else ''}), whose in-model figures it would hold: give "
                             "--table the table of that store (`cutlass-tune best --storage ...`) or the store itself")
    return stored


def _captured(target: str, tokens: int | None, gpu: int):
    """The model's GEMMs, recorded on the meta device, or on the GPU where the model reads tensor
    values (the meta device has none) and a GPU is there."""
    import torch

    from ..capture import CaptureError, capture_gemms, load_target

    try:
        return capture_gemms(load_target(target, _arguments(tokens)))
    except CaptureError:
        if not torch.cuda.is_available():
            raise
    torch.cuda.set_device(gpu)
    return capture_gemms(load_target(target, _arguments(tokens)), device="cuda")


def _arguments(tokens: int | None) -> dict[str, int] | None:
    return None if tokens is None else {"tokens": tokens}


def _progress(began: float, what: str) -> None:
    """One line of where a long run is, with the seconds since it began (a step under
    torch.compile or a kernel's nvcc takes minutes, and a silent run cannot be told from a hung one)."""
    out.print(f"[{time.perf_counter() - began:5.0f} s] {what}")


def _tune_at(target: str, tokens: int | None, table: BestTable, problems: list, mode, rounds: int,
             began: float, gpu: int):
    """One token count: the profiled rotation of the candidates and the choice (printed); returns
    the choices and the model's step."""
    from ..bench._in_model import BoardWatch, bind, build_step, precompile, profiled_steps
    from ..capture import load_target
    from ..regime import RegimeSpec
    from ..search._in_model import (
        TORCH,
        InModelRun,
        call_counts,
        choose,
        duty_cycle,
        kernel_spans,
        kernel_times,
        schedule,
        step_frame,
    )

    steps = schedule(problems)
    frames = [step_frame(table.frame, s) for s in steps]
    unbuilt = [c.row for p in problems for c in p.candidates
               if c.row is not None and c.row["config_hash"] not in table.bundled]  # a bundle's are built
    if unbuilt:
        _progress(began, f"compiling the kernels of {len(unbuilt)} candidates outside the table's bundle")
        precompile(unbuilt)
    tables = [BestTable(f, bundled=table.bundled) for f in frames]
    bind(table)
    step = build_step(load_target(target, _arguments(tokens)), mode)
    _progress(began, f"model built; {len(steps)} candidate steps a round, each run once "
              f"({mode.value}{': the first compiles the model' if mode.value == 'compiled' else ''}), "
              f"then {rounds} profiled rounds")
    board = BoardWatch(gpu)
    events = profiled_steps(step, tables, rounds, watch=board)
    run = InModelRun(RegimeSpec.in_model(mode, tokens), board.sm_mhz, board.power_w)
    _progress(began, "profiled" + (f" at {board.sm_mhz:.0f} MHz" if math.isfinite(board.sm_mhz) else "")
              + (f", {board.power_w:.0f} W" if math.isfinite(board.power_w) else ""))
    names = {name: c.problem for c in problems for name in c.names}
    choices = choose(problems, steps * rounds, kernel_times(events, names), calls=call_counts(events, names), run=run)
    shown = Table("problem", "candidate", "in-model us", "vs torch", "", box=None, pad_edge=False)
    for choice in choices:
        torch_us = choice.times_us[TORCH]
        for label, us in sorted(choice.times_us.items(), key=lambda kv: kv[1]):
            shown.add_row(choice.problem, label, f"{us:.1f}", f"{torch_us / us:.3f}",
                          "kept" if label == choice.kept.label else "")
    where = f" at {tokens} tokens" if tokens is not None else ""
    out.print(f"{len(problems)} problems of the table in the model{where}: {len(steps)} candidates a round, "
              f"{rounds} rounds, {mode.value} (regime {run.regime.name}); median kernel time per step")
    out.print(shown)
    regime = duty_cycle(kernel_spans(events))
    if regime is not None:
        out.print(f"the profiled steps' duty cycle: {regime.name} (`confirm --regime {regime.name}` times a "
                  "problem in it; the profiler's host time widens the gaps)")
    return choices, step


VIA_PRODUCT = "torch via the product"
"""The A/B side of the model on a table without rows: torch's path through the product's doors."""


def _ab(step, tokens: int | None, table: BestTable, tuned: BestTable, blocks: int, baseline=None, *,
        graphs: bool = False) -> None:
    """The whole step on the in-model table, the input table and torch's path (the baseline
    model's step where there is one, and the model on a table without rows), alternating
    blocks; then where the in-model step's time differs from each other side's. `graphs`: each
    side's step captured in a CUDA graph with its table bound, and replayed."""
    from ..bench._in_model import ab, bind, graphed
    from ..search._in_model import GainSplit

    empty = BestTable(table.frame.iloc[:0])
    steps = {"in-model": (step, tuned), "input table": (step, table), VIA_PRODUCT: (step, empty)}
    if baseline is not None:
        steps["torch"] = (baseline, empty)
    if graphs:
        for label, (run, bound) in steps.items():
            bind(bound)
            steps[label] = (graphed(run), bound)
    sides = ab(steps, blocks=blocks)
    ours = sides[0]
    shown = Table("step on", "ms", "spread", "in-model speedup", "GEMM kernels ms", "other kernels ms",
                  "rest ms", box=None, pad_edge=False)
    for side in sides:
        speedup = side.median_ms / ours.median_ms
        kinds = ["-"] * 3 if side.split is None else [
            f"{side.split.gemm_us / 1e3:.3f}", f"{side.split.other_us / 1e3:.3f}",
            f"{side.median_ms - side.split.kernels_us / 1e3:.3f}"]
        shown.add_row(side.label, f"{side.median_ms:.3f}", f"{side.spread:.1%}",
                      f"{speedup:.3f}" if math.isfinite(speedup) else "-", *kinds)
    where = (f" at {tokens} tokens" if tokens else "") + (", each side a CUDA graph" if graphs else "")
    out.print(f"A/B of the whole step{where}, {blocks} alternating blocks "
              "of 5 steps each (CUDA events; spread: (p80 - p20) / median); kernel time per step: the median of 5 "
              "profiled steps, the sides in turn; rest: the step less its kernels (host time the GPU waits on, gaps):")
    out.print(shown)
    if ours.split is None:
        return
    for side in sides[1:]:
        if side.split is None:
            continue
        gain = GainSplit.of(ours.median_ms, ours.split, side.median_ms, side.split)
        out.print(f"in-model against {side.label}: {gain.total_ms:+.3f} ms a step = GEMM kernels {gain.gemm_ms:+.3f} "
                  f"+ other kernels {gain.other_kernels_ms:+.3f} + host and gaps {gain.host_and_gaps_ms:+.3f}")


def _table_format(path: Path | None) -> str:
    if path is None:
        return ""
    fmt = path.suffix.lstrip(".")
    if fmt not in ("csv", "json", "parquet"):
        raise TuneModelError(f"--out {path}: expected a .csv, .json or .parquet file")
    return fmt
