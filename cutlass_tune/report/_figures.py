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
from ..space import KernelConfig, RuntimeArgs, Scaling
from ..status import Status


def ok_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The successful measurements of `frame` (with a positive TFLOP/s)."""
    return frame[(frame.status == Status.OK.value) & frame.tflops.notna() & (frame.tflops > 0)]


def reason_label(status: str, reason: str, width: int = 90) -> str:
    """"status: first line of the reason", cut to `width` characters."""
    text = f"{status}: {first_reason(reason)}"
    return text if len(text) <= width else text[: width - 3] + "..."


def first_reason(reason: str | None, width: int = 300) -> str:
    """The first line of a reason ("no reason given" for none), cut to `width` characters."""
    first = (reason or "").strip().splitlines()[0] if (reason or "").strip() else "no reason given"
    return first if len(first) <= width else first[: width - 3] + "..."


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
            low, high = spread_range(best.tflops, best.median_ms, best.p20_ms, best.p80_ms)
            ratio_low, ratio_high = ((best.ratio_low, best.ratio_high) if best.confirm_passes
                                     else spread_range(best.ratio, best.median_ms, best.p20_ms, best.p80_ms))
            best_rows.append({"problem": p, "epilogue": operation, "baseline": baseline, "kernel": best.kernel,
                              "runtime": best.runtime + confirmed, "tflops": best.tflops,
                              "cublas": best.cublas_tflops, "ratio": best.ratio,
                              "compiled": best.torch_compile_tflops, "compiled_ratio": best.torch_compile_ratio,
                              "configs": configs, "tflops_low": low, "tflops_high": high,
                              "ratio_low": ratio_low, "ratio_high": ratio_high})
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
        low, high = spread_range(best.tflops, best.median_ms, best.p20_ms, best.p80_ms)
        best_rows.append({"problem": p, "epilogue": operation, "baseline": baseline, "kernel": best.kernel,
                          "runtime": best.runtime, "tflops": best.tflops, "cublas": cublas,
                          "ratio": best.tflops / cublas, "compiled": math.nan, "compiled_ratio": math.nan,
                          "configs": configs, "tflops_low": low, "tflops_high": high,
                          "ratio_low": low / cublas, "ratio_high": high / cublas})
    table = pd.DataFrame(best_rows, columns=["problem", "epilogue", "baseline", "kernel", "runtime", "tflops",
                                             "cublas", "ratio", "compiled", "compiled_ratio", "configs",
                                             "tflops_low", "tflops_high", "ratio_low", "ratio_high"])
    fig = go.Figure()
    fig.add_bar(name="best CUTLASS", x=table.problem, y=table.tflops,
                error_y=_bars(table.tflops, table.tflops_low, table.tflops_high),
                customdata=table[["kernel", "runtime", "tflops_low", "tflops_high"]].to_numpy(),
                hovertemplate=("%{x}<br>%{customdata[0]}<br>%{customdata[1]}<br>%{y:.1f} TFLOP/s"
                               "<br>samples p20-p80: %{customdata[2]:.1f}-%{customdata[3]:.1f}<extra></extra>"))
    names = sorted(set(table.baseline), key=lambda b: b != Baseline.CUBLAS.value)
    fig.add_bar(name=f"{' / '.join(names) or 'cuBLAS'} (same run)", x=table.problem, y=table.cublas,
                customdata=table[["baseline"]].to_numpy(),
                hovertemplate="%{x}<br>%{customdata[0]} %{y:.1f} TFLOP/s (paired)<extra></extra>")
    if table.compiled.notna().any():
        fig.add_bar(name="torch.compile (same run)", x=table.problem, y=table.compiled,
                    hovertemplate="%{x}<br>torch.compile %{y:.1f} TFLOP/s<extra></extra>")
    # A log axis: a 128^3 problem runs at under 1 TFLOP/s beside 700 for 8192^3.
    fig.update_layout(barmode="group", yaxis_title="TFLOP/s (log axis)", yaxis_type="log", xaxis_title="problem")
    title = "Best CUTLASS kernel vs cuBLAS, by problem" if names in ([], [Baseline.CUBLAS.value]) else (
        "Best CUTLASS kernel vs its baseline (cuBLAS; torch eager and torch.compile for fused epilogues), by problem")
    return _layout(fig, title + ": TFLOP/s; error bars p20-p80 of the kernel's samples", 440), table


def summary_ratio(table: pd.DataFrame) -> go.Figure:
    """The best kernel's ratio to its paired baseline per problem (the `summary` table's), with
    its range: the confirmation passes' where confirmed, else the p20-p80 of the kernel's samples."""
    fig = go.Figure()
    fig.add_bar(name="best CUTLASS / baseline", x=table.problem, y=table.ratio,
                error_y=_bars(table.ratio, table.ratio_low, table.ratio_high),
                text=[f"{r:.3f}" if pd.notna(r) else "" for r in table.ratio], textposition="outside",
                customdata=table[["baseline", "ratio_low", "ratio_high"]].to_numpy(),
                hovertemplate=("%{x}<br>%{y:.3f}x %{customdata[0]}<br>range %{customdata[1]:.3f}-"
                               "%{customdata[2]:.3f}<extra></extra>"))
    if table.compiled_ratio.notna().any():
        fig.add_bar(name="best CUTLASS / torch.compile", x=table.problem, y=table.compiled_ratio,
                    hovertemplate="%{x}<br>%{y:.3f}x torch.compile<extra></extra>")
    fig.add_hline(y=1.0, line_dash="dash", line_color="gray", annotation_text="baseline (= 1)",
                  annotation_position="bottom right")
    fig.update_layout(barmode="group", yaxis_title="baseline time / kernel time (>1: faster)", xaxis_title="problem")
    return _layout(fig, "Best CUTLASS kernel's ratio to its baseline of the same run, by problem", 420)


def _bars(y: pd.Series, low: pd.Series, high: pd.Series) -> dict[str, Any]:
    """Asymmetric error bars from `low` and `high` around `y` (none where they are missing)."""
    return dict(type="data", symmetric=False, array=(high - y).clip(lower=0).fillna(0).to_numpy(),
                arrayminus=(y - low).clip(lower=0).fillna(0).to_numpy(), visible=True)


def spread_range(value: float, median_ms: float | None, p20_ms: float | None,
                 p80_ms: float | None) -> tuple[float, float]:
    """The range of a speed figure (TFLOP/s or a ratio, both inverse to the kernel's time) over the
    p20-p80 of its samples: `value` scaled by median/p80 and median/p20; `value` twice where the
    samples' figures are missing."""
    if not (median_ms and p20_ms and p80_ms) or any(map(pd.isna, (median_ms, p20_ms, p80_ms))):
        return value, value
    return value * median_ms / p80_ms, value * median_ms / p20_ms


def heatmap(ok: pd.DataFrame, rows: str, cols: str, title: str, row_label: str, col_label: str,
             row_key: Callable[[str], Any], col_key: Callable[[str], Any]) -> go.Figure:
    """Best TFLOP/s over everything else for each (rows, cols) cell; blank cells were not measured."""
    best = ok.groupby([rows, cols]).tflops.max().unstack(cols)
    best = best.reindex(index=sorted(best.index, key=row_key), columns=sorted(best.columns, key=col_key))
    count = ok.groupby([rows, cols]).config_hash.nunique().unstack(cols).reindex_like(best)
    fig = go.Figure(go.Heatmap(
        z=best.to_numpy(), x=list(best.columns), y=list(best.index), customdata=count.fillna(0).to_numpy(),
        colorscale="Viridis", texttemplate="%{z:.3g}", hoverongaps=False, colorbar=dict(title="TFLOP/s"),
        hovertemplate=(f"{row_label} %{{y}}<br>{col_label} %{{x}}<br>best %{{z:.1f}} TFLOP/s"
                       "<br>%{customdata:.0f} configs<extra></extra>")))
    fig.update_xaxes(type="category", title=col_label)
    fig.update_yaxes(type="category", title=row_label, autorange="reversed")
    return _layout(fig, title, max(320, 34 * len(best.index) + 160))


def numeric_key(label: str) -> tuple:
    return tuple(int(x) if x.isdigit() else -1 for x in str(label).replace("x", " ").split())


def history(problem: str, kernels: pd.DataFrame, order: dict[str, int], baseline_tflops: float | None,
            baseline: str = "cuBLAS") -> go.Figure:
    """Each compiled config's best run-time variant in store order, and the best so far.

    Each point is its measurement's ratio to the baseline it was paired with (the store's `ratio`,
    the figure `best` ranks by), so the baseline is the line at 1 for every point; error bars span
    the p20-p80 of the kernel's samples. A problem none of whose measurements has a ratio is drawn
    in TFLOP/s (log axis) against `baseline_tflops`, the best table's baseline figure."""
    ok = kernels[(kernels.status == Status.OK.value) & kernels.tflops.notna() & (kernels.tflops > 0)]
    rated = ok.ratio.notna().any()
    figure = "ratio" if rated else "tflops"
    ok = ok[ok[figure].notna()]
    top = ok.loc[ok.groupby("config_hash")[figure].idxmax()] if not ok.empty else ok
    per = kernels.groupby("config_hash").agg(kernel=("kernel", "first")).reset_index()
    per = per.merge(top[["config_hash", figure, "median_ms", "p20_ms", "p80_ms"]], on="config_hash", how="left")
    per["compiled"] = per.config_hash.map(order)
    per = per.sort_values("compiled")
    per["best"] = per[figure].cummax().ffill()
    ranges = [spread_range(v, m, lo, hi) for v, m, lo, hi in zip(per[figure], per.median_ms, per.p20_ms, per.p80_ms)]
    per["low"], per["high"] = [r[0] for r in ranges], [r[1] for r in ranges]
    unit = "x " + baseline if rated else " TFLOP/s"
    fig = go.Figure()
    fig.add_scatter(x=per.compiled, y=per[figure], mode="markers", name="config (best run-time variant)",
                    error_y=_bars(per[figure], per.low, per.high),
                    customdata=per[["kernel", "low", "high"]].to_numpy(), marker=dict(size=7, opacity=0.6),
                    hovertemplate=(f"#%{{x}}: %{{customdata[0]}}<br>%{{y:.3f}}{unit}<br>samples p20-p80: "
                                   f"%{{customdata[1]:.3f}}-%{{customdata[2]:.3f}}<extra></extra>"))
    fig.add_scatter(x=per.compiled, y=per.best, mode="lines", name="best so far", line_shape="hv",
                    hovertemplate=f"after %{{x}} configs: %{{y:.3f}}{unit}<extra></extra>")
    line = 1.0 if rated else baseline_tflops
    if line:
        fig.add_hline(y=line, line_dash="dash", line_color="gray", annotation_position="bottom right",
                      annotation_text=f"{baseline} (paired with each point)" if rated else f"{baseline} (same run)")
    fig.update_layout(xaxis_title="configs compiled (store order)", legend=dict(orientation="h", y=-0.2),
                      yaxis_title=f"{baseline} time / kernel time (>1: faster)" if rated else "TFLOP/s (log axis)",
                      yaxis_type="linear" if rated else "log")
    return _layout(fig, f"Search history: {problem}", 420)


def importances(problem: str, ok: pd.DataFrame) -> tuple[go.Figure | None, str]:
    """PED-ANOVA importances of every knob, compile-time and run-time (raster, swizzle, splits,
    decomposition), over the successful measurements of `ok` (one per config and run-time
    variant, as the store holds them: the Optuna study's trials carry only the compile-time knobs
    and each config's best variant), scored by their ratio to the paired baseline (TFLOP/s where
    none has one). Deterministic and needs no scikit-learn. None and a note where there are none."""
    import optuna

    figure = "ratio" if ok.ratio.notna().any() else "tflops"
    ok = ok[ok[figure].notna()]
    knobs = [k.name for k in (*KernelConfig.knobs, *RuntimeArgs.knobs)
             if k.name in ok.columns and ok[k.name].nunique() > 1]
    if len(ok) < 2 or not knobs:
        return None, (f"No parameter importances: {len(ok)} successful measurement{'' if len(ok) == 1 else 's'} "
                      f"of this problem, {len(knobs)} knob{'' if len(knobs) == 1 else 's'} that vary among them "
                      "(at least 2 measurements and 1 knob needed).")
    choices: dict[str, optuna.distributions.BaseDistribution] = {
        k: optuna.distributions.CategoricalDistribution(sorted(map(str, ok[k].unique()))) for k in knobs}
    trials = [optuna.trial.create_trial(params={k: str(v) for k, v in zip(knobs, values)}, distributions=choices,
                                        value=float(value))
              for value, *values in ok[[figure, *knobs]].itertuples(index=False)]
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # as the sweep does: no INFO line per study
    study = optuna.create_study(direction="maximize")
    study.add_trials(trials)
    try:
        found = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    except Exception as err:  # an analysis that fails must not cost the user the whole report
        return None, f"No parameter importances: {type(err).__name__}: {err}"
    runtime = {k.name for k in RuntimeArgs.knobs}
    # Ties ordered by name: Optuna's order of tied knobs follows set iteration, which changes per process.
    ranked = sorted(found.items(), key=lambda kv: (kv[1], kv[0]))
    kinds = ["run-time" if k in runtime else "compile-time" for k, _ in ranked]
    fig = go.Figure(go.Bar(x=[v for _, v in ranked], y=[k for k, _ in ranked], orientation="h", customdata=kinds,
                           marker_color=["darkorange" if k == "run-time" else "steelblue" for k in kinds],
                           hovertemplate="%{y} (%{customdata}): %{x:.3f}<extra></extra>"))
    fig.update_layout(xaxis_title="importance (PED-ANOVA)", yaxis_title="knob (orange: run-time)")
    what = "ratio to the paired baseline" if figure == "ratio" else "TFLOP/s"
    return (_layout(fig, f"Parameter importances: {problem}", max(320, 32 * len(ranked) + 140)),
            f"From {len(ok)} successful measurements (config x run-time variant) of the store, by their {what}; "
            "run-time knobs in orange; invalid and failed configs left out.")


def compile_scatter(problem: str, kernels: pd.DataFrame) -> go.Figure:
    per = (kernels.assign(ok_tflops=kernels.tflops.where(kernels.status == Status.OK.value))
           .groupby("config_hash").agg(tflops=("ok_tflops", "max"), seconds=("compile_seconds", "max"),
                                       kernel=("kernel", "first"), schedule=("kernel_schedule", "first"),
                                       status=("status", lambda s: ", ".join(sorted(set(s) - {Status.OK.value}))))
           .reset_index())
    failed_rows = kernels[kernels.status != Status.OK.value]
    why = {h: reason_label(st, r) for h, st, r in zip(failed_rows.config_hash, failed_rows.status, failed_rows.reason)}
    per["reason"] = [why.get(h, "") for h in per.config_hash]
    fig = go.Figure()
    for schedule, group in per[per.tflops.notna()].groupby("schedule"):
        fig.add_scatter(x=group.seconds, y=group.tflops, mode="markers", name=str(schedule),
                        customdata=group.kernel, marker=dict(size=8, opacity=0.75),
                        hovertemplate="%{customdata}<br>compile %{x:.1f} s<br>%{y:.1f} TFLOP/s<extra></extra>")
    failed = per[per.tflops.isna()]
    if not failed.empty:
        fig.add_scatter(x=failed.seconds, y=[0] * len(failed), mode="markers", name="failed",
                        customdata=failed[["kernel", "reason"]].to_numpy(),
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


def failure_list(kernels: pd.DataFrame, trials: list[Any]) -> list[dict[str, str]]:
    """Each failed config of a problem with its reason, for the page: the store's failed
    measurements (status and the first line of the reason, one entry per config, run-time variant
    and reason), then the Optuna study's trials that did not complete (an invalid proposal,
    rejected before nvcc, or a failure the study recorded), with their `reason` attribute."""
    import optuna

    out: list[dict[str, str]] = []
    failed = kernels[kernels.status != Status.OK.value]
    for (kernel, runtime, status, reason), _ in failed.groupby(
            ["kernel", "runtime", "status", failed.reason.fillna("")], sort=False, dropna=False):
        out.append({"source": "measurement", "kernel": str(kernel), "runtime": str(runtime or ""),
                    "status": str(status), "reason": first_reason(reason)})
    shown = {(r["kernel"], r["status"]) for r in out}
    states = {optuna.trial.TrialState.FAIL: "failed trial", optuna.trial.TrialState.PRUNED: "invalid"}
    for t in trials:
        if t.state not in states:
            continue
        status = "invalid" if (t.constraints or {}).get("invalid") else states[t.state]
        kernel = str(t.user_attrs.get("config", f"trial {t.number}"))
        if (kernel, status) in shown:
            continue
        shown.add((kernel, status))
        reason = str(t.user_attrs.get("reason", ""))
        out.append({"source": "Optuna study", "kernel": kernel, "runtime": "", "status": status,
                    "reason": first_reason(reason)})
    return out
