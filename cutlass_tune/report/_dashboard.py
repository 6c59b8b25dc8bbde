"""The sweep dashboard: one self-contained, interactive HTML file from a results store.

It reads the measurement rows and the Optuna studies of one store and writes a single file that
works offline (plotly.js is inlined, nothing is fetched): best CUTLASS kernel against its baseline
per problem (cuBLAS; for a fused epilogue or scaled fp8 torch eager and torch.compile, with the
epilogue in a column of its own), in TFLOP/s on a log axis and as ratios, with the p20-p80 spread
of the kernel's samples; each baseline figure is the one its ratio was paired with (the store's
`cublas_tflops`, the best table's per problem). Then per problem (switched by a selector)
TFLOP/s by tile x cluster, by kernel schedule x stages and by raster x swizzle, the search
history (ratios to the paired baseline), parameter importances of compile-time and run-time
knobs, compile time against TFLOP/s, the failures by reason, and each failed or invalid config
with its reason. The figures are `_figures`'; the page is templates/dashboard.html.j2, rendered
with autoescape (plotly escapes the JSON of its figures).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
import plotly.graph_objects as go
import plotly.offline
import sqlalchemy as sa
from markupsafe import Markup

from .._files import shipped, write_atomically
from ..errors import CutlassTuneError
from ..measurement import Baseline, EnvStamp, TimingMethod
from ..space import Decomposition, KernelConfig, Problem, RasterOrder, RuntimeArgs, texts
from ..status import Status
from ..store import ResultStore, StoredRow, open_store, read_error, readable_store, shown_url
from ..tables import COLUMNS, BestTableError, regime_text
from . import _figures as figures
from ._best import load_best

_COLUMNS = ("id", "problem", "kernel", "config_hash", "runtime", "status", "reason", "tflops",
            "cublas_tflops", "ratio", "compile_seconds", "throttled", "run_id", "study", "created_at",
            "record")
_PLOT_CONFIG = {"displaylogo": False, "responsive": True}
_LABELS = {k.name: k.label for k in (*KernelConfig.knobs, *RuntimeArgs.knobs)}
_TEMPLATES = jinja2.Environment(loader=jinja2.FileSystemLoader(str(shipped("templates"))), autoescape=True,
                                undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                                keep_trailing_newline=True)


class DashboardError(CutlassTuneError):
    """The store holds nothing the dashboard can show."""


@dataclasses.dataclass(frozen=True)
class Dashboard:
    """What `write_dashboard` wrote."""

    path: Path
    storage: str
    problems: tuple[str, ...]
    measurements: int


def write_dashboard(url: str | Path, path: str | Path) -> Dashboard:
    """Build the dashboard of the store at `url` (or a .sqlite file, or a gzip-compressed
    .sqlite.gz) and write it to `path`
    atomically (its folder made if need be). Only reads the store.

    Raises:
        StoreError: no such SQLite store, or the store cannot be reached or read.
        DashboardError: no measurement, or no successful one.
        FileWriteError: `path` cannot be written.
    """
    data = _load(url)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, _page(data))
    return Dashboard(path=path, storage=data.shown_url, problems=tuple(data.problems),
                     measurements=len(data.rows))


def build_dashboard(url: str | Path) -> str:
    """The dashboard of the store at `url` as one HTML document (see `write_dashboard`)."""
    return _page(_load(url))


# ---- reading ------------------------------------------------------------------------------
@dataclasses.dataclass
class _Data:
    shown_url: str
    gpu: str
    rows: pd.DataFrame  # one row per measurement, with the knobs and run-time args split out
    problems: list[str]
    trials: dict[str, list[Any]]  # problem -> its study's FrozenTrials ([] without a study)
    studies: dict[str, str]  # problem -> study name
    env: EnvStamp | None  # of the latest measurement that has one
    best: pd.DataFrame  # `load_best` of the store: the table `cutlass-tune best` prints (may be empty)


def _load(source: str | Path) -> _Data:
    with readable_store(source) as readable:  # a `.sqlite.gz` from a decompressed copy
        data = _read(readable)
    if readable != source:
        data.shown_url = shown_url(str(source))
    return data


def _read(source: str | Path) -> _Data:
    store = open_store(source)
    shown = store.shown
    raw = store.rows(_COLUMNS)
    if not raw:
        raise DashboardError(f"store {shown} has no measurements: run `cutlass-tune sweep` first")
    frame = _frame(raw, shown)
    kernels = frame[~frame.baseline]
    if kernels.empty:
        raise DashboardError(f"store {shown} has only baselines (cuBLAS, torch), no kernel measurement: "
                             "run `cutlass-tune sweep` first")
    if figures.ok_rows(kernels).empty:
        failed = kernels[kernels.status != Status.OK.value]
        reasons = collections.Counter(figures.reason_label(s, r) for s, r in zip(failed.status, failed.reason))
        common = reasons.most_common(1)[0][0] if reasons else "none recorded"
        raise DashboardError(f"store {shown} has no successful measurement: {len(failed)} failed "
                             f"(most common reason: {common})")
    problems = list(dict.fromkeys(frame.problem))
    studies, trials = _studies(store, frame, problems)
    envs = [m.env for m in frame.measurement if m.env is not None]
    try:
        best = load_best(store.url)
    except BestTableError:  # e.g. only kernels without a config (a bare library) succeeded
        best = pd.DataFrame(columns=list(COLUMNS))
    return _Data(shown_url=shown, gpu=store.gpu() or "unknown GPU", rows=frame, problems=problems,
                 trials=trials, studies=studies, env=envs[-1] if envs else None, best=best)


def _frame(raw: list[StoredRow], shown: str) -> pd.DataFrame:
    records = []
    for r in raw:
        try:
            m = r.measurement()
        except ValueError as err:  # DamagedRowError: one line naming the row
            raise DashboardError(f"store {shown} is damaged: {err}") from err
        c, rt = m.config, m.runtime
        records.append({
            **r.values(c for c in _COLUMNS if c != "record"),
            "measurement": m, "baseline": m.is_baseline, "method": m.method,
            "tile": f"{c.tile_m}x{c.tile_n}x{c.tile_k}" if c else None,
            **{k.name: k.text(c) if c else None for k in KernelConfig.knobs},
            **texts(rt),
            "variant": _raster_label(rt.raster, rt.decomposition, rt.splits),
            "median_ms": m.median_ms, "p20_ms": m.p20_ms, "p80_ms": m.p80_ms,
        })
    frame = pd.DataFrame.from_records(records)
    for column in ("tflops", "compile_seconds", "ratio", "cublas_tflops", "median_ms", "p20_ms", "p80_ms"):
        frame[column] = pd.to_numeric(frame[column])
    return frame


def _raster_label(raster: RasterOrder, decomposition: Decomposition, splits: int) -> str:
    label = raster.name.lower()
    if decomposition is not Decomposition.HEURISTIC or splits != 1:
        label += f" / {decomposition.name.lower()}" + (f" x{splits}" if splits != 1 else "")
    return label


def _studies(store: ResultStore, frame: pd.DataFrame,
             problems: list[str]) -> tuple[dict[str, str], dict[str, list[Any]]]:
    """Each problem's Optuna study and its trials. A store written without Optuna (no `studies`
    table) has none; the tables are not created just to look.

    Raises:
        StoreError: the database failed under SQLAlchemy or Optuna (a server lost after the
            rows were read, a damaged study table), as every other read of the store does.
    """
    import optuna

    try:
        return _read_studies(store, frame, problems)
    except (sa.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as err:
        cause = err.__cause__ if isinstance(err.__cause__, sa.exc.SQLAlchemyError) else err
        raise read_error(store.shown, cause) from err


def _read_studies(store: ResultStore, frame: pd.DataFrame,
                  problems: list[str]) -> tuple[dict[str, str], dict[str, list[Any]]]:
    if not sa.inspect(store.engine).has_table("studies"):
        return {}, {p: [] for p in problems}
    import optuna

    storage = optuna.storages.RDBStorage(store.url)
    names = set(optuna.study.get_all_study_names(storage))
    studies: dict[str, str] = {}
    trials: dict[str, list[Any]] = {}
    for p in problems:
        named = [s for s in frame[frame.problem == p].study.dropna() if s in names]
        name = (collections.Counter(named).most_common(1)[0][0] if named
                else next((s for s in sorted(names) if s.startswith(f"{p}_")), None))
        trials[p] = []
        if name is not None:
            studies[p] = name
            trials[p] = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    return studies, trials


# ---- the page: what the template shows, every value formatted -----------------------------
def _div(fig: go.Figure | None, div_id: str) -> Markup:
    if fig is None:
        return Markup("")
    return Markup(fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=_PLOT_CONFIG))


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None or pd.isna(value) else format(value, spec)


def _range(low: Any, high: Any, spec: str) -> str:
    """"low-high", or "-" where either is missing."""
    return "-" if "-" in (_fmt(low, spec), _fmt(high, spec)) else f"{_fmt(low, spec)}-{_fmt(high, spec)}"


def _paired_baseline(table: pd.DataFrame, kernels: pd.DataFrame, problem: str) -> float | None:
    """The baseline TFLOP/s a problem is shown against: the best table's (`summary`: the baseline
    paired with its best kernel, as `cutlass-tune best` reports it), else the median of the
    baselines its kernels' ratios were taken against (the store's `cublas_tflops`). Never the
    median of all its baseline rows, which no ratio was taken against."""
    found = table[table.problem == problem].cublas.dropna()
    if not found.empty:
        return float(found.iloc[0])
    paired = figures.ok_rows(kernels).cublas_tflops.dropna()
    return float(paired.median()) if not paired.empty else None


def _section(data: _Data, index: int, problem: str, order: dict[str, int], table: pd.DataFrame) -> dict[str, Any]:
    frame = data.rows
    kernels = frame[(frame.problem == problem) & ~frame.baseline & (frame.status != Status.INVALID.value)]
    ok = figures.ok_rows(kernels)
    base = figures.ok_rows(frame[(frame.problem == problem) & frame.baseline])
    cublas = _paired_baseline(table, kernels, problem)
    measured = frame[frame.problem == problem].measurement.iloc[0].problem
    baseline = Baseline.of(measured).value
    compiled = [m.compile_tflops for m in base.measurement if m.compile_tflops]
    trials = data.trials.get(problem, [])
    # A grouped baseline's row may carry a loop of one GEMM per expert and one dense GEMM of all
    # the rows (the bench stage's reference points); stores written before them have neither.
    references = {}
    for name in GROUPED_REFERENCES:
        found = [getattr(m, name, None) for m in base.measurement]
        found = [v for v in found if v]
        references[name] = _fmt(float(pd.Series(found).median()) if found else None, ".1f")
    sid = f"p{index}"
    cells = []

    def cell(fig: go.Figure | None, name: str, note: str = "") -> None:
        cells.append({"name": name, "figure": _div(fig, f"{sid}-{name}"), "note": note})

    if not ok.empty:
        key = figures.numeric_key
        cell(figures.heatmap(ok, "tile", "cluster", f"TFLOP/s by tile (MxNxK) x cluster: {problem}", "tile",
                             _LABELS["cluster"], key, key), "tile", HEATMAP_NOTE)
        cell(figures.heatmap(ok, "kernel_schedule", "stages", f"TFLOP/s by kernel schedule x stages: {problem}",
                             _LABELS["kernel_schedule"], _LABELS["stages"], str,
                             lambda s: (s != "auto", key(s))), "schedule")
        cell(figures.heatmap(ok, "variant", "swizzle", f"TFLOP/s by raster x swizzle: {problem}", _LABELS["raster"],
                             _LABELS["swizzle"], str, key), "raster")
    else:
        cell(None, "tile", "No successful measurement of this problem.")
    cell(figures.history(problem, kernels, order, cublas, baseline), "history")
    fig, note = figures.importances(problem, ok)
    cell(fig, "importance", note)
    cell(figures.compile_scatter(problem, kernels), "compile")
    fig, note = figures.failures(problem, kernels, trials)
    cell(fig, "failures", note)
    return {"id": sid, "problem": problem, "configs": kernels.config_hash.nunique(),
            "measurements": len(kernels), "failed": len(kernels) - len(ok), "cublas": _fmt(cublas, ".1f"),
            "baseline": baseline, "epilogue": measured.epilogue.name, "scaling": measured.scaling.value,
            "experts": _experts_label(measured), "loop": references["loop_tflops"],
            "dense": references["dense_tflops"],
            "compiled": _fmt(float(pd.Series(compiled).median()) if compiled else None, ".1f"),
            "study": data.studies.get(problem), "trials": len(trials),
            "invalid": sum(1 for t in trials if (t.constraints or {}).get("invalid")), "cells": cells,
            "failures": figures.failure_list(kernels, trials)}


HEATMAP_NOTE = ("Each cell of these heatmaps is the highest TFLOP/s of any one measurement of its configs (the "
                "median of one launch's samples), so the highest cell may be above the TFLOP/s of the table's best "
                "kernel: the table ranks a problem's kernels by their ratio to the baseline paired with them, over "
                "the confirmation passes where cutlass-tune confirm ran, not by one measurement's TFLOP/s.")
"""Why the heatmaps' best differs from the best table's (the page's caption under the first heatmap)."""

GROUPED_REFERENCES = ("loop_tflops", "dense_tflops")
"""The fields of a grouped problem's baseline measurement the page shows where present."""


def _experts_label(problem: Problem) -> str:
    """A grouped problem's experts in words ("128 experts, zipf routing, 2-6031 rows each"); empty
    for a single GEMM."""
    if not problem.grouped:
        return ""
    rows = problem.group_rows
    spread = f", {min(rows)}-{max(rows)} rows each" if rows else ""
    return f"{problem.groups} experts, {problem.routing.value} routing{spread}"


def _runs(frame: pd.DataFrame) -> list[dict[str, Any]]:
    runs = (frame.groupby("run_id", sort=False)
            .agg(first=("created_at", "min"), last=("created_at", "max"), rows=("id", "size")).reset_index())
    return runs.to_dict("records")


def _environment(env: EnvStamp | None) -> str:
    if env is None:
        return "environment not recorded"
    return (f"{env.sm_count} SMs, driver {env.driver}, CUDA {env.cuda_runtime}, torch {env.torch}, "
            f"nvcc {env.nvcc}, CUTLASS {env.cutlass}")


def _boards(data: _Data) -> dict[str, Any] | None:
    """Where a sweep measured on several GPUs: each board's share, and its cuBLAS per problem
    against the mean of the boards (boards of one model differ by a few percent, which is why
    every ratio is taken on one board). None for a store measured on one board."""
    frame = data.rows
    board = [m.env.gpu_uuid or (f"device {m.env.device}" if m.env.device is not None else None)
             if m.env is not None else None for m in frame.measurement]
    device = [m.env.device if m.env is not None else None for m in frame.measurement]
    frame = frame.assign(board=pd.Series(board, index=frame.index), device=pd.Series(device, index=frame.index))
    frame = frame[frame.board.notna()]
    if frame.board.nunique() < 2:
        return None
    base = figures.ok_rows(frame[frame.baseline])
    cublas = base.groupby(["board", "problem"]).tflops.median().unstack()
    problems = [p for p in data.problems if p in cublas.columns]
    relative = cublas[problems] / cublas[problems].mean()
    kernels = frame[~frame.baseline]
    rows = []
    for name in frame.groupby("board").device.min().sort_values(na_position="last").index:
        mine = kernels[kernels.board == name]
        rows.append({
            "name": name,
            "devices": ", ".join(str(int(d)) for d in sorted(frame[frame.board == name].device.dropna().unique())),
            "measurements": len(mine), "throttled": int(mine.throttled.fillna(False).astype(bool).sum()),
            "relative": [_fmt(relative.loc[name, p] if name in relative.index else None, ".3f") for p in problems],
        })
    return {"problems": problems, "rows": rows}


def _timing_note(method: str) -> str:
    """What a method times, for the page (a method this version does not know, by its name)."""
    try:
        return TimingMethod(method).facts.note
    except ValueError:
        return method


def _page(data: _Data) -> str:
    frame = data.rows
    compiled = frame[~frame.baseline & frame.config_hash.notna() & (frame.status != Status.INVALID.value)]
    order = {h: i + 1 for i, h in enumerate(dict.fromkeys(compiled.config_hash))}
    summary, table = figures.summary(frame, data.problems, data.best)
    methods = sorted(set(frame[frame.status == Status.OK.value].method) - {""})
    by_regime = {str(r["problem"]): regime_text(r) for r in data.best.to_dict("records")}
    best = [{"problem": r.problem, "epilogue": r.epilogue, "kernel": r.kernel, "runtime": r.runtime,
             "tflops": _fmt(r.tflops, ".1f"), "baseline": r.baseline, "cublas": _fmt(r.cublas, ".1f"),
             "ratio": _fmt(r.ratio, ".3f"), "compiled": _fmt(r.compiled, ".1f"),
             "compiled_ratio": _fmt(r.compiled_ratio, ".3f"), "configs": r.configs,
             "tflops_range": _range(r.tflops_low, r.tflops_high, ".1f"),
             "ratio_range": _range(r.ratio_low, r.ratio_high, ".3f"),
             "regimes": by_regime.get(str(r.problem)) or "-"}
            for r in table.itertuples()]
    return _TEMPLATES.get_template("dashboard.html.j2").render(
        gpu=data.gpu, storage=data.shown_url, measurements=len(frame), problems=data.problems,
        environment=_environment(data.env),
        timing="; ".join(_timing_note(m) for m in methods) or "unknown method",
        throttled=int(frame.throttled.fillna(False).astype(bool).sum()), runs=_runs(frame),
        boards=_boards(data), summary=_div(summary, "summary"),
        summary_ratio=_div(figures.summary_ratio(table), "summary-ratio"), best=best,
        regimes=any(by_regime.values()),
        sections=[_section(data, i, p, order, table) for i, p in enumerate(data.problems)],
        plotly_js=Markup(plotly.offline.get_plotlyjs()),
        written_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
