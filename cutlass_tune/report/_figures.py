"""The dashboard's figures: plotly figures of a store's measurements, one function each.

Each takes the measurement rows as `_dashboard` reads them (one row per measurement, the knobs
and run-time arguments split out, `baseline` set for baseline rows: cuBLAS, or torch eager for a
fused problem) and returns a figure, with a note
where a figure may be missing.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ..measurement import Baseline
from ..space import Scaling
from ..status import Status


def ok_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The successful measurements of `frame` (with a positive TFLOP/s)."""
    return frame[(frame.status == Status.OK.value) & frame.tflops.notna() & (frame.tflops > 0)]


def reason_label(status: str, reason: str, width: int = 90) -> str:
    """"status: first line of the reason", cut to `width` characters."""
    first = (reason or "").strip().splitlines()[0] if (reason or "").strip() else "no reason given"
    text = f"{status}: {first}"
    return text if len(text) <= width else text[: width - 3] + "..."


def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(title=title, height=height, template="plotly_white",
                      margin=dict(l=70, r=30, t=80, b=60), hoverlabel=dict(align="left"))
    return fig


def _operation(frame: pd.DataFrame, problem: str) -> tuple[str, str]:
    """The epilogue and scaling of `problem` (as a table writes them) and its baseline's name."""
    m = frame[frame.problem == problem].measurement.iloc[0].problem
    operation = m.epilogue.name + (f", scale-{m.scaling.value}" if m.scaling is not Scaling.NONE else "")
    return operation, Baseline.of(m).value


def summary(frame: pd.DataFrame, problems: list[str], best_table: pd.DataFrame) -> tuple[go.Figure, pd.DataFrame]:
    """Best kernel per problem next to its baseline of the same run (cuBLAS; torch eager for a
    fused epilogue or scaled fp8, with torch.compile where the run timed it), as a figure and a
    table. `best_table` is `load_best` of the store (may be empty)."""
    best_rows = []
    for p in problems:
        configs = frame[(frame.problem == p) & ~frame.baseline].config_hash.nunique()
        operation, baseline = _operation(frame, p)
        found = best_table[best_table.problem == p]
        if not found.empty:  # as `cutlass-tune best` ranks: same-run ratios, confirmed medians first
            best = found.iloc[0]
            method = f" {best.method}" if best.method else ""
            energy = (f"; {best.energy_mj:.0f} mJ per GEMM, {baseline} {best.cublas_energy_mj:.0f}"
                      if pd.notna(best.energy_mj) and pd.notna(best.cublas_energy_mj) else "")
            confirmed = (f" (median of {best.confirm_passes}{method} confirmation passes, {best.ratio_low:.3f}-"
                         f"{best.ratio_high:.3f}; sweep {best.sweep_ratio:.3f}{energy})" if best.confirm_passes else "")
            best_rows.append({"problem": p, "epilogue": operation, "baseline": baseline, "kernel": best.kernel,
                              "runtime": best.runtime + confirmed, "tflops": best.tflops,
                              "cublas": best.cublas_tflops, "ratio": best.ratio,
                              "compiled": best.torch_compile_tflops, "compiled_ratio": best.torch_compile_ratio,
                              "configs": configs})
            continue
        ok = ok_rows(frame[(frame.problem == p) & ~frame.baseline])  # kernels without a config only
        if ok.empty:
            continue
        rated = ok[ok.ratio.notna()]
        best = rated.iloc[rated.ratio.argmax()] if not rated.empty else ok.iloc[ok.tflops.argmax()]
        cublas = best.cublas_tflops
        if pd.isna(cublas):  # the baseline of that run failed or was not recorded
            base = ok_rows(frame[(frame.problem == p) & frame.baseline & (frame.run_id == best.run_id)])
            cublas = base.tflops.max() if not base.empty else float("nan")
        best_rows.append({"problem": p, "epilogue": operation, "baseline": baseline, "kernel": best.kernel,
                          "runtime": best.runtime, "tflops": best.tflops, "cublas": cublas,
                          "ratio": best.tflops / cublas, "compiled": math.nan, "compiled_ratio": math.nan,
                          "configs": configs})
    table = pd.DataFrame(best_rows, columns=["problem", "epilogue", "baseline", "kernel", "runtime", "tflops",
                                             "cublas", "ratio", "compiled", "compiled_ratio", "configs"])
    fig = go.Figure()
    fig.add_bar(name="best CUTLASS", x=table.problem, y=table.tflops,
                text=[f"{r:.3f}x {b}" if pd.notna(r) else "" for r, b in zip(table.ratio, table.baseline)],
                textposition="outside", customdata=table[["kernel", "runtime"]].to_numpy(),
                hovertemplate="%{x}<br>%{customdata[0]}<br>%{customdata[1]}<br>%{y:.1f} TFLOP/s<extra></extra>")
    names = sorted(set(table.baseline), key=lambda b: b != Baseline.CUBLAS.value)
    fig.add_bar(name=f"{' / '.join(names) or 'cuBLAS'} (same run)", x=table.problem, y=table.cublas,
                text=[f"{c:.0f}" if pd.notna(c) else "" for c in table.cublas], textposition="outside",
                customdata=table[["baseline"]].to_numpy(),
                hovertemplate="%{x}<br>%{customdata[0]} %{y:.1f} TFLOP/s<extra></extra>")
    if table.compiled.notna().any():
        fig.add_bar(name="torch.compile (same run)", x=table.problem, y=table.compiled,
                    text=[f"{c:.0f}" if pd.notna(c) else "" for c in table.compiled], textposition="outside",
                    hovertemplate="%{x}<br>torch.compile %{y:.1f} TFLOP/s<extra></extra>")
    fig.update_layout(barmode="group", yaxis_title="TFLOP/s", xaxis_title="problem",
                      yaxis_range=[0, 1.15 * pd.concat([table.tflops, table.cublas, table.compiled]).max()])
    title = "Best CUTLASS kernel vs cuBLAS, by problem" if names in ([], [Baseline.CUBLAS.value]) else (
        "Best CUTLASS kernel vs its baseline (cuBLAS; torch eager and torch.compile for fused epilogues), by problem")
    return _layout(fig, title, 440), table


def heatmap(ok: pd.DataFrame, rows: str, cols: str, title: str, row_label: str, col_label: str,
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


def numeric_key(label: str) -> tuple:
    return tuple(int(x) if x.isdigit() else -1 for x in str(label).replace("x", " ").split())


def history(problem: str, kernels: pd.DataFrame, order: dict[str, int], cublas: float | None,
            baseline: str = "cuBLAS") -> go.Figure:
    per = (kernels.assign(ok_tflops=kernels.tflops.where(kernels.status == Status.OK.value))
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
        fig.add_hline(y=cublas, line_dash="dash", line_color="gray", annotation_text=baseline,
                      annotation_position="bottom right")
    fig.update_layout(xaxis_title="configs compiled (store order)", yaxis_title="TFLOP/s",
                      legend=dict(orientation="h", y=-0.2))
    return _layout(fig, f"Search history: {problem}", 420)


def importances(problem: str, trials: list[Any]) -> tuple[go.Figure | None, str]:
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
    # Ties ordered by name: Optuna's order of tied knobs follows set iteration, which changes per process.
    ranked = sorted(found.items(), key=lambda kv: (kv[1], kv[0]))
    fig = go.Figure(go.Bar(x=[v for _, v in ranked], y=[k for k, _ in ranked], orientation="h",
                           hovertemplate="%{y}: %{x:.3f}<extra></extra>"))
    fig.update_layout(xaxis_title="importance (PED-ANOVA)", yaxis_title="knob")
    return (_layout(fig, f"Parameter importances: {problem}", max(320, 32 * len(ranked) + 140)),
            f"From {len(feasible)} completed feasible trials of the Optuna study; invalid proposals left out.")


def compile_scatter(problem: str, kernels: pd.DataFrame) -> go.Figure:
    per = (kernels.assign(ok_tflops=kernels.tflops.where(kernels.status == Status.OK.value))
           .groupby("config_hash").agg(tflops=("ok_tflops", "max"), seconds=("compile_seconds", "max"),
                                       kernel=("kernel", "first"), schedule=("kernel_schedule", "first"),
                                       status=("status", lambda s: ", ".join(sorted(set(s) - {Status.OK.value}))))
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


def failures(problem: str, kernels: pd.DataFrame, trials: list[Any]) -> tuple[go.Figure | None, str]:
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
    failed = kernels[kernels.status != Status.OK.value]
    broken: collections.Counter[str] = collections.Counter()
    for status, reason in zip(failed.status, failed.reason):
        label = reason_label(status, reason)
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
