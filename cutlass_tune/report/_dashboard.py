"""The sweep dashboard: one self-contained, interactive HTML file from a results store.

It reads the measurement rows and the Optuna studies of one store and writes a single file that
works offline (plotly.js is inlined, nothing is fetched): best CUTLASS kernel against cuBLAS per
problem, then per problem (switched by a selector) TFLOP/s by tile x cluster, by kernel schedule x
stages and by raster x swizzle, the search history, parameter importances, compile time against
TFLOP/s, and the failures by reason. Everything this module writes into HTML itself goes through
`html.escape`; plotly escapes the JSON of its figures.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import html
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import plotly.graph_objects as go
import plotly.offline
import sqlalchemy as sa

from ..measurement import EnvStamp, Measurement
from ..errors import CutlassTuneError
from ..space import Decomposition, KernelConfig, RasterOrder, RuntimeArgs, texts
from ..store import ResultStore
from ._best import COLUMNS, BestTableError, load_best

TIMING_NOTES = {"events": "L2-cold CUDA events", "graph": "CUDA-graph replays (warm L2)"}
_COLUMNS = ("id", "problem", "kernel", "config_hash", "runtime", "status", "reason", "tflops",
            "cublas_tflops", "ratio", "compile_seconds", "throttled", "run_id", "study", "created_at",
            "record")
_PLOT_CONFIG = {"displaylogo": False, "responsive": True}
_LABELS = {k.name: k.label for k in (*KernelConfig.knobs, *RuntimeArgs.knobs)}


class DashboardError(CutlassTuneError):
    """The store is missing or holds nothing the dashboard can show."""


@dataclasses.dataclass(frozen=True)
class Dashboard:
    """What `write_dashboard` wrote."""

    path: Path
    storage: str
    problems: tuple[str, ...]
    measurements: int


def write_dashboard(url: str | Path, path: str | Path) -> Dashboard:
    """Build the dashboard of the store at `url` (or a .sqlite file) and write it to `path`
    atomically (a temporary file in the same folder, then a rename). Only reads the store.

    Raises:
        StoreError: the store cannot be reached or read.
        DashboardError: no such SQLite file, no measurement, or no successful one.
    """
    data = _load(_as_url(url))
    page = _page(data)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Dashboard(path=path, storage=data.shown_url, problems=tuple(data.problems),
                     measurements=len(data.rows))


def build_dashboard(url: str | Path) -> str:
    """The dashboard of the store at `url` as one HTML document (see `write_dashboard`)."""
    return _page(_load(_as_url(url)))


def _as_url(source: str | Path) -> str:
    """A store URL, or a path to a SQLite file made into one."""
    text = str(source)
    if "://" not in text and Path(text).suffix in (".sqlite", ".sqlite3", ".db"):
        return f"sqlite:///{text}"
    return text


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


def _load(url: str) -> _Data:
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        parsed = None  # ResultStore says what is wrong with it
    if (parsed is not None and parsed.get_backend_name() == "sqlite" and parsed.database
            and parsed.database != ":memory:" and not Path(parsed.database).exists()):
        raise DashboardError(f"no store at {parsed.database}: pass the URL of a sweep's store with --storage")
    store = ResultStore(url)
    shown = store.engine.url.render_as_string(hide_password=True)
    raw = store.rows(_COLUMNS)
    if not raw:
        raise DashboardError(f"store {shown} has no measurements: run `cutlass-tune sweep` first")
    frame = _frame(raw, shown)
    kernels = frame[~frame.baseline]
    if kernels.empty:
        raise DashboardError(f"store {shown} has only cuBLAS baselines, no kernel measurement: "
                             "run `cutlass-tune sweep` first")
    if _ok(kernels).empty:
        failed = kernels[kernels.status != "ok"]
        reasons = collections.Counter(_reason_label(s, r) for s, r in zip(failed.status, failed.reason))
        common = reasons.most_common(1)[0][0] if reasons else "none recorded"
        raise DashboardError(f"store {shown} has no successful measurement: {len(failed)} failed "
                             f"(most common reason: {common})")
    problems = list(dict.fromkeys(frame.problem))
    studies, trials = _studies(store, url, frame, problems)
    envs = [m.env for m in frame.measurement if m.env is not None]
    try:
        best = load_best(url)
    except BestTableError:  # e.g. only kernels without a config (a bare library) succeeded
        best = pd.DataFrame(columns=list(COLUMNS))
    return _Data(shown_url=shown, gpu=store.gpu() or "unknown GPU", rows=frame, problems=problems,
                 trials=trials, studies=studies, env=envs[-1] if envs else None, best=best)


def _frame(raw: list[dict[str, Any]], shown: str) -> pd.DataFrame:
    records = []
    for r in raw:
        try:
            m = Measurement.from_dict(json.loads(r["record"]))
        except (ValueError, KeyError, TypeError) as err:
            raise DashboardError(f"store {shown}: measurement {r['id']} cannot be read: {err}") from err
        c, rt = m.config, m.runtime
        records.append({
            **{k: v for k, v in r.items() if k != "record"},
            "measurement": m, "baseline": m.is_baseline, "method": m.method,
            "tile": f"{c.tile_m}x{c.tile_n}x{c.tile_k}" if c else None,
            **{k.name: k.text(c) if c else None for k in KernelConfig.knobs},
            **texts(rt),
            "raster": _raster_label(rt.raster, rt.decomposition, rt.splits),
        })
    frame = pd.DataFrame.from_records(records)
    for column in ("tflops", "compile_seconds", "ratio", "cublas_tflops"):
        frame[column] = pd.to_numeric(frame[column])
    return frame


def _raster_label(raster: RasterOrder, decomposition: Decomposition, splits: int) -> str:
    label = raster.name.lower()
    if decomposition is not Decomposition.HEURISTIC or splits != 1:
        label += f" / {decomposition.name.lower()}" + (f" x{splits}" if splits != 1 else "")
    return label


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[(frame.status == "ok") & frame.tflops.notna() & (frame.tflops > 0)]


def _reason_label(status: str, reason: str, width: int = 90) -> str:
    first = (reason or "").strip().splitlines()[0] if (reason or "").strip() else "no reason given"
    text = f"{status}: {first}"
    return text if len(text) <= width else text[: width - 3] + "..."


def _studies(store: ResultStore, url: str, frame: pd.DataFrame,
             problems: list[str]) -> tuple[dict[str, str], dict[str, list[Any]]]:
    """Each problem's Optuna study and its trials. A store written without Optuna (no `studies`
    table) has none; the tables are not created just to look."""
    if not sa.inspect(store.engine).has_table("studies"):
        return {}, {p: [] for p in problems}
    import optuna

    storage = optuna.storages.RDBStorage(url)
    names = set(optuna.study.get_all_study_names(storage))
    studies, trials = {}, {}
    for p in problems:
        named = [s for s in frame[frame.problem == p].study.dropna() if s in names]
        name = (collections.Counter(named).most_common(1)[0][0] if named
                else next((s for s in sorted(names) if s.startswith(f"{p}_")), None))
        trials[p] = []
        if name is not None:
            studies[p] = name
            trials[p] = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    return studies, trials


# ---- figures ------------------------------------------------------------------------------
def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(title=title, height=height, template="plotly_white",
                      margin=dict(l=70, r=30, t=80, b=60), hoverlabel=dict(align="left"))
    return fig


def _summary(data: _Data) -> tuple[go.Figure, pd.DataFrame]:
    """Best kernel per problem next to the cuBLAS baseline of the same run."""
    frame = data.rows
    best_rows = []
    for p in data.problems:
        configs = frame[(frame.problem == p) & ~frame.baseline].config_hash.nunique()
        found = data.best[data.best.problem == p]
        if not found.empty:  # as `cutlass-tune best` ranks: same-run ratios, confirmed medians first
            best = found.iloc[0]
            confirmed = (f" (median of {best.confirm_passes} confirmation passes, {best.ratio_low:.3f}-"
                         f"{best.ratio_high:.3f}; sweep {best.sweep_ratio:.3f})" if best.confirm_passes else "")
            best_rows.append({"problem": p, "kernel": best.kernel, "runtime": best.runtime + confirmed,
                              "tflops": best.tflops, "cublas": best.cublas_tflops, "ratio": best.ratio,
                              "configs": configs})
            continue
        ok = _ok(frame[(frame.problem == p) & ~frame.baseline])  # kernels without a config only
        if ok.empty:
            continue
        rated = ok[ok.ratio.notna()]
        best = rated.loc[rated.ratio.idxmax()] if not rated.empty else ok.loc[ok.tflops.idxmax()]
        cublas = best.cublas_tflops
        if pd.isna(cublas):  # the baseline of that run failed or was not recorded
            base = _ok(frame[(frame.problem == p) & frame.baseline & (frame.run_id == best.run_id)])
            cublas = base.tflops.max() if not base.empty else float("nan")
        best_rows.append({"problem": p, "kernel": best.kernel, "runtime": best.runtime, "tflops": best.tflops,
                          "cublas": cublas, "ratio": best.tflops / cublas, "configs": configs})
    table = pd.DataFrame(best_rows)
    fig = go.Figure()
    fig.add_bar(name="best CUTLASS", x=table.problem, y=table.tflops,
                text=[f"{r:.3f}x cuBLAS" if pd.notna(r) else "" for r in table.ratio], textposition="outside",
                customdata=table[["kernel", "runtime"]].to_numpy(),
                hovertemplate="%{x}<br>%{customdata[0]}<br>%{customdata[1]}<br>%{y:.1f} TFLOP/s<extra></extra>")
    fig.add_bar(name="cuBLAS (same run)", x=table.problem, y=table.cublas,
                text=[f"{c:.0f}" if pd.notna(c) else "" for c in table.cublas], textposition="outside",
                hovertemplate="%{x}<br>cuBLAS %{y:.1f} TFLOP/s<extra></extra>")
    fig.update_layout(barmode="group", yaxis_title="TFLOP/s", xaxis_title="problem",
                      yaxis_range=[0, 1.15 * pd.concat([table.tflops, table.cublas]).max()])
    return _layout(fig, "Best CUTLASS kernel vs cuBLAS, by problem", 440), table


def _heatmap(ok: pd.DataFrame, rows: str, cols: str, title: str, row_label: str, col_label: str,
             row_key: Callable[[str], Any], col_key: Callable[[str], Any]) -> go.Figure:
    """Best TFLOP/s over everything else for each (rows, cols) cell; blank cells were not measured."""
    best = ok.groupby([rows, cols]).tflops.max().unstack(cols)
    best = best.reindex(index=sorted(best.index, key=row_key), columns=sorted(best.columns, key=col_key))
    count = ok.groupby([rows, cols]).config_hash.nunique().unstack(cols).reindex_like(best)
    fig = go.Figure(go.Heatmap(
        z=best.to_numpy(), x=list(best.columns), y=list(best.index), customdata=count.fillna(0).to_numpy(),
        colorscale="Viridis", texttemplate="%{z:.0f}", hoverongaps=False, colorbar=dict(title="TFLOP/s"),
        hovertemplate=(f"{row_label} %{{y}}<br>{col_label} %{{x}}<br>best %{{z:.1f}} TFLOP/s"
                       "<br>%{customdata:.0f} configs<extra></extra>")))
    fig.update_xaxes(type="category", title=col_label)
    fig.update_yaxes(type="category", title=row_label, autorange="reversed")
    return _layout(fig, title, max(320, 34 * len(best.index) + 160))


def _numeric_key(label: str) -> tuple:
    return tuple(int(x) if x.isdigit() else -1 for x in str(label).replace("x", " ").split())


def _history(problem: str, kernels: pd.DataFrame, order: dict[str, int], cublas: float | None) -> go.Figure:
    per = (kernels.assign(ok_tflops=kernels.tflops.where(kernels.status == "ok"))
           .groupby("config_hash").agg(tflops=("ok_tflops", "max"), kernel=("kernel", "first")).reset_index())
    per["compiled"] = per.config_hash.map(order)
    per = per.sort_values("compiled")
    per["best"] = per.tflops.cummax().ffill()
    fig = go.Figure()
    fig.add_scatter(x=per.compiled, y=per.tflops, mode="markers", name="config (best run-time variant)",
                    customdata=per.kernel, marker=dict(size=7, opacity=0.6),
                    hovertemplate="#%{x}: %{customdata}<br>%{y:.1f} TFLOP/s<extra></extra>")
    fig.add_scatter(x=per.compiled, y=per.best, mode="lines", name="best so far", line_shape="hv",
                    hovertemplate="after %{x} configs: %{y:.1f} TFLOP/s<extra></extra>")
    if cublas:
        fig.add_hline(y=cublas, line_dash="dash", line_color="gray", annotation_text="cuBLAS",
                      annotation_position="bottom right")
    fig.update_layout(xaxis_title="configs compiled (store order)", yaxis_title="TFLOP/s",
                      legend=dict(orientation="h", y=-0.2))
    return _layout(fig, f"Search history: {problem}", 420)


def _importances(problem: str, trials: list[Any]) -> tuple[go.Figure | None, str]:
    """PED-ANOVA importances over the feasible completed trials (needs no scikit-learn and is
    deterministic), or None and a note saying why there are none."""
    import optuna

    feasible = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None
                and not (t.constraints or {}).get("invalid")]
    if len(feasible) < 2:
        return None, (f"No parameter importances: {len(feasible)} completed feasible trial"
                      f"{'' if len(feasible) == 1 else 's'} in the study (at least 2 needed).")
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # as the sweep does: no INFO line per study
    study = optuna.create_study(direction="maximize")
    study.add_trials(feasible)
    try:
        found = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    except Exception as err:  # an analysis that fails must not cost the user the whole report
        return None, f"No parameter importances: {type(err).__name__}: {err}"
    ranked = sorted(found.items(), key=lambda kv: kv[1])
    fig = go.Figure(go.Bar(x=[v for _, v in ranked], y=[k for k, _ in ranked], orientation="h",
                           hovertemplate="%{y}: %{x:.3f}<extra></extra>"))
    fig.update_layout(xaxis_title="importance (PED-ANOVA)", yaxis_title="knob")
    return (_layout(fig, f"Parameter importances: {problem}", max(320, 32 * len(ranked) + 140)),
            f"From {len(feasible)} completed feasible trials of the Optuna study; invalid proposals left out.")


def _compile_scatter(problem: str, kernels: pd.DataFrame) -> go.Figure:
    per = (kernels.assign(ok_tflops=kernels.tflops.where(kernels.status == "ok"))
           .groupby("config_hash").agg(tflops=("ok_tflops", "max"), seconds=("compile_seconds", "max"),
                                       kernel=("kernel", "first"), schedule=("kernel_schedule", "first"),
                                       status=("status", lambda s: ", ".join(sorted(set(s) - {"ok"}))))
           .reset_index())
    fig = go.Figure()
    for schedule, group in per[per.tflops.notna()].groupby("schedule"):
        fig.add_scatter(x=group.seconds, y=group.tflops, mode="markers", name=str(schedule),
                        customdata=group.kernel, marker=dict(size=8, opacity=0.75),
                        hovertemplate="%{customdata}<br>compile %{x:.1f} s<br>%{y:.1f} TFLOP/s<extra></extra>")
    failed = per[per.tflops.isna()]
    if not failed.empty:
        fig.add_scatter(x=failed.seconds, y=[0] * len(failed), mode="markers", name="failed",
                        customdata=failed[["kernel", "status"]].to_numpy(),
                        marker=dict(symbol="x", size=9, color="crimson"),
                        hovertemplate="%{customdata[0]}<br>%{customdata[1]}<br>compile %{x:.1f} s<extra></extra>")
    fig.update_layout(xaxis_title="compile seconds", yaxis_title="best TFLOP/s", legend_title="schedule")
    return _layout(fig, f"Compile time vs TFLOP/s: {problem}", 420)


def _failures(problem: str, kernels: pd.DataFrame, trials: list[Any]) -> tuple[go.Figure | None, str]:
    """Invalid proposals (from the study: never compiled) and failed measurements (from the
    store), counted by reason."""
    invalid: collections.Counter[str] = collections.Counter()
    example: dict[str, str] = {}
    for t in trials:
        if (t.constraints or {}).get("invalid"):
            reason = str(t.user_attrs.get("reason", ""))
            label = "invalid: " + (reason.split(":", 1)[0] if reason else "no reason given")
            invalid[label] += 1
            example.setdefault(label, reason)
    failed = kernels[kernels.status != "ok"]
    broken: collections.Counter[str] = collections.Counter()
    for status, reason in zip(failed.status, failed.reason):
        label = _reason_label(status, reason)
        broken[label] += 1
        example.setdefault(label, reason or "")
    note = (f"{sum(invalid.values())} invalid proposals (rejected before nvcc, from the Optuna study); "
            f"{sum(broken.values())} failed measurements (from the store).")
    if not invalid and not broken:
        return None, "No failures: every proposal was valid and every measurement succeeded."
    fig = go.Figure()
    for name, counts in (("invalid proposal", invalid), ("failed measurement", broken)):
        if counts:
            ranked = sorted(counts.items(), key=lambda kv: kv[1])
            fig.add_bar(name=name, orientation="h", x=[c for _, c in ranked], y=[k for k, _ in ranked],
                        customdata=[example[k][:300] for k, _ in ranked],
                        hovertemplate="%{y}: %{x}<br>e.g. %{customdata}<extra></extra>")
    fig.update_layout(xaxis_title="count", legend=dict(orientation="h", y=-0.25), yaxis=dict(automargin=True))
    return _layout(fig, f"Failures by reason: {problem}", max(340, 26 * (len(invalid) + len(broken)) + 180)), note


# ---- the page -----------------------------------------------------------------------------
def _div(fig: go.Figure, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=_PLOT_CONFIG)


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None or pd.isna(value) else format(value, spec)


def _problem_section(data: _Data, index: int, problem: str, order: dict[str, int]) -> str:
    frame = data.rows
    kernels = frame[(frame.problem == problem) & ~frame.baseline & (frame.status != "invalid")]
    ok = _ok(kernels)
    base = _ok(frame[(frame.problem == problem) & frame.baseline])
    cublas = float(base.tflops.median()) if not base.empty else None
    trials = data.trials.get(problem, [])
    invalid = sum(1 for t in trials if (t.constraints or {}).get("invalid"))
    study = data.studies.get(problem)
    sid = f"p{index}"
    parts = [f'<section class="problem" id="{sid}" data-problem="{_esc(problem)}">',
             f"<h2>{_esc(problem)}</h2>",
             f"<p>{kernels.config_hash.nunique()} configs measured, {len(kernels)} measurements "
             f"({len(kernels) - len(ok)} failed); cuBLAS {_fmt(cublas, '.1f')} TFLOP/s; "
             + (f"Optuna study <code>{_esc(study)}</code>: {len(trials)} trials, {invalid} invalid proposals."
                if study else "no Optuna study in this store.") + "</p>",
             '<div class="grid">']

    def cell(fig: go.Figure | None, name: str, note: str = "") -> None:
        body = _div(fig, f"{sid}-{name}") if fig is not None else ""
        parts.append(f'<div class="cell" data-section="{name}">{body}'
                     + (f'<p class="note">{_esc(note)}</p>' if note else "") + "</div>")

    if not ok.empty:
        cell(_heatmap(ok, "tile", "cluster", f"TFLOP/s by tile (MxNxK) x cluster: {problem}", "tile",
                      _LABELS["cluster"], _numeric_key, _numeric_key), "tile")
        cell(_heatmap(ok, "kernel_schedule", "stages", f"TFLOP/s by kernel schedule x stages: {problem}",
                      _LABELS["kernel_schedule"], _LABELS["stages"], str,
                      lambda s: (s != "auto", _numeric_key(s))), "schedule")
        cell(_heatmap(ok, "raster", "swizzle", f"TFLOP/s by raster x swizzle: {problem}", _LABELS["raster"],
                      _LABELS["swizzle"], str, _numeric_key), "raster")
    else:
        cell(None, "tile", "No successful measurement of this problem.")
    cell(_history(problem, kernels, order, cublas), "history")
    fig, note = _importances(problem, trials)
    cell(fig, "importance", note)
    cell(_compile_scatter(problem, kernels), "compile")
    fig, note = _failures(problem, kernels, trials)
    cell(fig, "failures", note)
    parts.append("</div></section>")
    return "\n".join(parts)


def _header(data: _Data) -> str:
    frame = data.rows
    runs = (frame.groupby("run_id", sort=False)
            .agg(first=("created_at", "min"), last=("created_at", "max"), rows=("id", "size")).reset_index())
    methods = sorted(set(frame[frame.status == "ok"].method) - {""})
    timing = "; ".join(TIMING_NOTES.get(m, m) for m in methods) or "unknown method"
    env = data.env
    env_line = (f"{env.sm_count} SMs, driver {env.driver}, CUDA {env.cuda_runtime}, torch {env.torch}, "
                f"nvcc {env.nvcc}, CUTLASS {env.cutlass}" if env is not None else "environment not recorded")
    throttled = int(frame.throttled.fillna(False).astype(bool).sum())
    run_rows = "".join(f"<tr><td><code>{_esc(r.run_id)}</code></td><td>{_esc(r.first)}</td>"
                       f"<td>{_esc(r.last)}</td><td>{r.rows}</td></tr>" for r in runs.itertuples())
    return (f"<h1>cutlass-tune sweep on {_esc(data.gpu)}</h1>"
            f"<p>Store <code>{_esc(data.shown_url)}</code>: {len(frame)} measurements of "
            f"{len(data.problems)} problems. {_esc(env_line)}.</p>"
            f"<p>Timing: {_esc(timing)}; cuBLAS measured in the same run. TFLOP/s is the median of the samples."
            + (f" {throttled} measurements ran while the GPU was throttled." if throttled else "") + "</p>"
            f'<table class="runs"><tr><th>run</th><th>first measurement (UTC)</th><th>last</th>'
            f"<th>measurements</th></tr>{run_rows}</table>")


def _boards(data: _Data) -> str:
    """Where a sweep measured on several GPUs: each board's share, and its cuBLAS per problem
    against the mean of the boards (boards of one model differ by a few percent, which is why
    every ratio is taken on one board). Empty for a store measured on one board."""
    frame = data.rows
    board = [m.env.gpu_uuid or (f"device {m.env.device}" if m.env.device is not None else None)
             if m.env is not None else None for m in frame.measurement]
    frame = frame.assign(board=board, device=[m.env.device if m.env is not None else None
                                              for m in frame.measurement])
    frame = frame[frame.board.notna()]
    if frame.board.nunique() < 2:
        return ""
    base = _ok(frame[frame.baseline])
    cublas = base.groupby(["board", "problem"]).tflops.median().unstack()
    problems = [p for p in data.problems if p in cublas.columns]
    relative = cublas[problems] / cublas[problems].mean()
    kernels = frame[~frame.baseline]
    head = "".join(f"<th>{_esc(p)}</th>" for p in problems)
    rows = []
    order = frame.groupby("board").device.min().sort_values(na_position="last").index
    for name in order:
        group = frame[frame.board == name]
        mine = kernels[kernels.board == name]
        throttled = int(mine.throttled.fillna(False).astype(bool).sum())
        cells = "".join(f"<td>{_fmt(relative.loc[name, p] if name in relative.index else None, '.3f')}</td>"
                        for p in problems)
        devices = ", ".join(str(int(d)) for d in sorted(group.device.dropna().unique()))
        rows.append(f"<tr><td><code>{_esc(name)}</code></td><td>{_esc(devices)}</td><td>{len(mine)}</td>"
                    f"<td>{throttled}</td>{cells}</tr>")
    return ('<p>Measured on several GPUs; each kernel\'s ratio is taken against cuBLAS on the GPU that '
            "measured it. cuBLAS TFLOP/s per GPU, relative to the mean of the GPUs (median of its baselines):</p>"
            '<table class="boards"><tr><th>GPU</th><th>device</th><th>kernel measurements</th>'
            f"<th>throttled</th>{head}</tr>{''.join(rows)}</table>")


def _best_table(table: pd.DataFrame) -> str:
    rows = "".join(
        f"<tr><td>{_esc(r.problem)}</td><td><code>{_esc(r.kernel)}</code></td><td><code>{_esc(r.runtime)}</code>"
        f"</td><td>{_fmt(r.tflops, '.1f')}</td><td>{_fmt(r.cublas, '.1f')}</td><td>{_fmt(r.ratio, '.3f')}</td>"
        f"<td>{r.configs}</td></tr>" for r in table.itertuples())
    return ('<table class="best"><tr><th>problem</th><th>best kernel</th><th>run-time variant</th>'
            "<th>TFLOP/s</th><th>cuBLAS</th><th>vs cuBLAS</th><th>configs</th></tr>" + rows + "</table>")


_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
code { font-size: 0.9em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25em 0.7em; text-align: left; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(560px, 1fr)); gap: 1em; }
.cell { min-width: 0; }
.note { color: #555; font-size: 0.9em; }
.selector { position: sticky; top: 0; background: #fff; padding: 0.5em 0; z-index: 10; font-size: 1.05em; }
"""

# All sections are drawn visible so plotly measures real sizes; the unselected ones are hidden
# once the page has loaded, and a shown section's plots are resized to the current window.
_SCRIPT = """
(function () {
  var select = document.getElementById("problem-select");
  function show() {
    document.querySelectorAll("section.problem").forEach(function (section) {
      section.hidden = section.id !== select.value;
      if (!section.hidden) {
        section.querySelectorAll(".js-plotly-plot").forEach(function (plot) { Plotly.Plots.resize(plot); });
      }
    });
  }
  select.addEventListener("change", show);
  window.addEventListener("load", show);
})();
"""


def _page(data: _Data) -> str:
    frame = data.rows
    compiled = frame[~frame.baseline & frame.config_hash.notna() & (frame.status != "invalid")]
    order = {h: i + 1 for i, h in enumerate(dict.fromkeys(compiled.config_hash))}
    summary, table = _summary(data)
    options = "".join(f'<option value="p{i}">{_esc(p)}</option>' for i, p in enumerate(data.problems))
    sections = "\n".join(_problem_section(data, i, p, order) for i, p in enumerate(data.problems))
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>cutlass-tune: {_esc(data.gpu)}</title>
<style>{_CSS}</style>
<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>
</head>
<body>
{_header(data)}
{_boards(data)}
<div class="cell" data-section="summary">{_div(summary, "summary")}</div>
{_best_table(table)}
<div class="selector"><label for="problem-select">Problem: </label><select id="problem-select">{options}</select></div>
{sections}
<p class="note">Written by cutlass-tune dashboard at {_esc(stamp)}.</p>
<script type="text/javascript">{_SCRIPT}</script>
</body>
</html>
"""
