"""Best-config tables built from a store: the best verified kernel per (GPU, problem).

The table's columns are those of `cutlass_tune.tables` (tables/_schema.py).

The best is chosen by `ratio`: figures from different runs are compared through their
same-run cuBLAS baselines, never as absolute TFLOP/s. Where `cutlass-tune confirm` re-measured
a problem's leading candidates, the best is the candidate with the highest median confirmed
ratio, and `ratio` is that median (a sweep's best is the largest of many noisy medians, so it
reads high). A kernel that ever gave a wrong result on a problem, with any run-time variant,
is never that problem's best.

A fused epilogue or scaled fp8 problem (`Problem.epilogue`, `Problem.scaling`) is its own
problem, with its own rows: its `ratio` is to torch's eager call of the same math, measured in
the same run (`measurement.Baseline.EAGER`), and `torch_compile_ratio` to `torch.compile` of that
function where the run timed it, carried over through the eager row of the same pass
(`Measurement.to_compile`, docs/epilogues.md), and `cublaslt_ratio` to cuBLASLt's own epilogue
where it computes the same math. `strongest` names the fastest of those torch paths in the pass
(`Measurement.strongest`) and `strongest_ratio` is the kernel's ratio to it: the figure a problem's
best is chosen by (for a plain or grouped problem, its `ratio`), and a kernel is a winner only
where it is above 1.

A grouped problem (MoE experts) is its own problem too, named with its experts and routing
(`Problem.name`); its `ratio` is to its baseline of the same run (`Baseline.of`:
torch._grouped_mm), and its rows carry `GROUPED_COLUMNS`.

Timing regimes (cutlass_tune/regime.py): of the bench's regimes, only rows timed back to back
(regime `sustained`, every row before regimes) rank a problem. Rows `confirm --regime` took in
another regime give the chosen kernel's figures in that regime (`REGIME_COLUMNS`: ratio, SM clock,
power), never its choice. The in-model regime's rows (`tune-model --storage`: the kernels timed
inside the user's model step) do choose: a problem with them takes the kernel its last tune-model
run found fastest in the model, among the variants the store verified on the problem, with its
`in_model_ratio` (torch's time in the model over the kernel's: below 1 where torch's path was
faster there, and the dispatcher then keeps torch's path) and the regime's name, SM clock and
power; `load_candidates` puts it first.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path

import pandas as pd

from ..errors import first_line, visible
from ..measurement import Baseline, Measurement, TimingMethod
from ..regime import SUSTAINED, Regime
from ..space import cells
from ..status import Status
from ..store import (
    CONFIRM_STUDY,
    LEGACY_TIMING,
    DamagedRowError,
    ResultStore,
    StoredRow,
    is_compressed_store,
    open_store,
    readable_store,
    store_url_of,
)
from ..tables import COLUMNS, REGIME_COLUMNS, BestTableError, check_row, experts_cells, read_local


def _measurements(store: ResultStore, rows: list[StoredRow]) -> list[Measurement]:
    """The Measurement of each of `rows`, rebuilt from its `record`; a record that cannot be
    rebuilt is a BestTableError naming its row."""
    records = {r.id: r for r in store.rows(["record"])}
    out = []
    for r in rows:
        try:
            out.append(records[r.id].measurement())
        except DamagedRowError as err:  # one line naming the row (json's own errors may span lines)
            raise BestTableError(f"store {store.shown} is damaged: {first_line(err)}") from err
    return out


class DamagedRowWarning(RuntimeWarning):
    """A measurement of the store holds a value no best-config table may hold (a negative size,
    an infinite or negative TFLOP/s, an unknown layout): `load_best` leaves it out."""


def _named(problem: object) -> str:
    return problem[:80] if isinstance(problem, str) and problem.strip() else repr(problem)[:40]


GROUPED_COLUMNS = ("grouping", "groups", "routing")
"""A grouped problem's columns beside m, n, k: "none"/"grouped", the experts (0 for a single
GEMM) and the routing ("" for a single GEMM); the problem's per-expert rows are in its name
(a histogram's digest) and in the store's records."""
_STORE_NUMBERS = ("tflops", "median_ms", "p20_ms", "p80_ms", "cublas_tflops", "ratio", "energy_mj",
                  "cublas_energy_mj", "torch_compile_tflops", "torch_compile_ratio", "cublaslt_tflops",
                  "cublaslt_ratio", "strongest_tflops", "strongest_ratio")
RANKING = tuple(m.value for m in sorted(TimingMethod, key=lambda m: m.facts.rank))
"""Which confirm passes rank a problem confirmed by several methods: the first method of this
order (`MethodFacts.rank`) that has them."""


def _from_store(url: str) -> pd.DataFrame:
    return _picked(_kernel_frame(url), 1)


def _in_model(name: object) -> bool:
    return str(name).partition(":")[0] == Regime.IN_MODEL.value


def _picked(frame: pd.DataFrame, top: int) -> pd.DataFrame:
    """Per (GPU, problem) of `frame` (`_kernel_frame`), its `top` leading kernel variants as table
    rows, best first: the in-model choice where the problem has one (`_in_model_pick`), then the
    ranking of its sustained rows (`_leading`)."""
    in_model = frame[frame["_regime"].map(_in_model)]
    # Rows of the bench's other regimes never rank: they are the chosen kernel's regime figures.
    benched = frame[~frame["_regime"].map(_in_model)]
    regimed = benched[benched["_regime"] != SUSTAINED.name]
    sustained = benched[benched["_regime"] == SUSTAINED.name]
    picked = []
    for (gpu, problem), group in sustained.groupby(["gpu", "problem"], sort=False):
        runs = in_model[(in_model["gpu"] == gpu) & (in_model["problem"] == problem)]
        if runs.empty:
            picked += _leading(group, regimed, top)
            continue
        ranked = _leading(group, regimed, len(group))
        chosen = _in_model_pick(group, ranked, runs, regimed)
        if chosen is None:
            picked += ranked[:top]
            continue
        key = tuple(chosen[_VARIANT])
        picked += [chosen, *(r for r in ranked if tuple(r[_VARIANT]) != key)][:top]
    return _table_of(picked, sustained)


def _in_model_pick(group: pd.DataFrame, ranked: list[pd.Series], runs: pd.DataFrame,
                   regimed: pd.DataFrame) -> pd.Series | None:
    """A problem's in-model choice as its table row, or None where it has none: of the in-model
    rows (`runs`) of the variants the store verified on the problem (its sustained rows, `group`),
    those of the last tune-model run, in the last regime it ran the problem in (a run at several
    token counts: the last, as `search._in_model.tuned_frame` keeps it), the variant of the highest
    median ratio (torch's time over the kernel's). Its row is its ranked one (`_leading`), else its
    best sustained row; its in_model columns are the run's."""
    verified = set(map(tuple, group[_VARIANT].itertuples(index=False)))
    runs = runs[[tuple(v) in verified for v in runs[_VARIANT].itertuples(index=False)]]
    runs = runs[runs["ratio"].notna()]
    if runs.empty:
        return None
    runs = runs[runs["run_id"] == runs["run_id"].iloc[-1]]
    runs = runs[runs["_regime"] == runs["_regime"].iloc[-1]]
    medians = runs.groupby(_VARIANT, sort=False)["ratio"].median()
    key = medians.idxmax()
    row = next((r.copy() for r in ranked if tuple(r[_VARIANT]) == key), None)
    if row is None:
        same = group[[tuple(v) == key for v in group[_VARIANT].itertuples(index=False)]]
        row = _unconfirmed(same, regimed, 1)[0]
    mine = runs[[tuple(v) == key for v in runs[_VARIANT].itertuples(index=False)]]
    col = Regime.IN_MODEL.column
    row[f"{col}_regime"] = str(mine["_regime"].iloc[-1])
    row[f"{col}_ratio"] = float(medians.max())
    row[f"{col}_sm_mhz"], row[f"{col}_power_w"] = float(mine["_sm_mhz"].median()), float(mine["_power_w"].median())
    return row


def _kernel_frame(url: str) -> pd.DataFrame:
    """Every verified kernel measurement of the store as a table row, with its pass's side
    figures, whether a confirm took it (`_confirm`) and its regime, SM clock and power."""
    store = open_store(url)
    # StoreError, not BestTableError: the dashboard shows a store whose best table cannot be
    # built (BestTableError) with an empty one, but must not read a store of another schema.
    store.check_schema()
    scheme = store.timing() or LEGACY_TIMING
    rows = store.rows()
    measurements = _measurements(store, rows)
    kernels = [m for m in measurements if not m.is_baseline and m.config is not None]
    if not kernels:
        raise BestTableError(f"store {store.shown} has no measurements: run `cutlass-tune sweep` first")
    if not any(r.status is Status.OK and not m.is_baseline for r, m in zip(rows, measurements)):
        reasons = pd.Series([f"{r.status.value}: {r.reason}" for r, m in zip(rows, measurements)
                             if not m.is_baseline and r.status is not None])
        raise BestTableError(f"store {store.shown} has no successful measurement: {len(reasons)} failed "
                             f"(most common: {reasons.value_counts().index[0][:120]})")
    wrong = {(r.gpu, r.problem, r.config_hash) for r in rows if r.status is Status.WRONG_RESULT}
    sides = _pass_figures(rows, measurements)
    out = []
    for r, m in zip(rows, measurements):
        if r.status is not Status.OK or m.is_baseline or m.config is None or not r.tflops:
            continue
        if (r.gpu, r.problem, r.config_hash) in wrong:
            continue
        ratio = r.ratio or math.nan
        got = sides.get((r.gpu, r.problem, r.run_id, m.repeat)) or _PassFigures(Baseline.of(m.problem).value)
        row = {
            **r.values(("gpu", "problem", "m", "n", "k", "kernel", "config_hash", "runtime", "tflops", "median_ms",
                        "p20_ms", "p80_ms", "samples", "cublas_tflops", "ratio", "run_id")),
            **m.problem.operation.cells(), **experts_cells(m.problem),
            "torch_compile_tflops": got.compile_tflops, "torch_compile_ratio": ratio / got.compile_factor,
            "cublaslt_tflops": got.lt_tflops, "cublaslt_ratio": ratio / got.lt_factor,
            "strongest": got.strongest, "strongest_tflops": (r.cublas_tflops or math.nan) * got.strongest_factor,
            "strongest_ratio": ratio / got.strongest_factor,
            **cells(m.runtime),
            **cells(m.config),
            "config": json.dumps(m.config.to_dict(), sort_keys=True),
            "_confirm": r.study == CONFIRM_STUDY,
            "method": m.method or scheme.method.value,
            "energy_mj": m.energy_mj, "cublas_energy_mj": m.baseline_energy_mj,
            "_regime": r.regime or SUSTAINED.name, "_sm_mhz": m.sm_mhz, "_power_w": m.power_w,
        }
        try:  # the rules every table's rows pass: a row the table's reader would refuse is never ranked
            check_row(row, f"store {store.shown}: measurement {r.id} ({_named(r.problem)})")
        except BestTableError as err:
            warnings.warn(visible(f"{err}; left out of the best-config table"), DamagedRowWarning, stacklevel=2)
            continue
        out.append(row)
    if not out:
        raise BestTableError(f"store {store.shown} has no kernel that verified every time it ran")
    frame = pd.DataFrame(out)
    # NULLs (a kernel of an unpaired store without a cuBLAS figure has no ratio) become NaN:
    # every figure is a float, which ranks (NaN ratios last) and formats ("nan") like one.
    frame = frame.assign(**{c: pd.to_numeric(frame[c]).astype(float) for c in _STORE_NUMBERS})
    frame["spread"] = (frame["p80_ms"] - frame["p20_ms"]) / frame["median_ms"]
    return frame.assign(**{c: pd.to_numeric(frame[c]).astype(float) for c in ("_sm_mhz", "_power_w")})


_VARIANT = ["gpu", "problem", "config_hash", "runtime"]
"""A kernel variant: a config and its run-time arguments, on one problem of one GPU model."""


def _table_of(picked: list[pd.Series], sustained: pd.DataFrame) -> pd.DataFrame:
    """The picked rows as a table of `COLUMNS`, each with the best ratio its sweep measured."""
    sweep_best = sustained[~sustained["_confirm"]].groupby(_VARIANT)["ratio"].max().rename("sweep_ratio")
    best = pd.DataFrame(picked).drop(columns=["_confirm", "_regime", "_sm_mhz", "_power_w"])
    best = best.join(sweep_best, on=_VARIANT)
    best["sweep_ratio"] = best["sweep_ratio"].fillna(best["ratio"])
    best["confirm_passes"] = best["confirm_passes"].astype(int)
    best = best.sort_values(["gpu", "m", "n", "k", "problem"], kind="stable")
    return best[[*COLUMNS, *(c for c in GROUPED_COLUMNS if c not in COLUMNS)]].reset_index(drop=True)


def _leading(group: pd.DataFrame, regimed: pd.DataFrame, top: int) -> list[pd.Series]:
    """A problem's `top` leading kernel variants, best first, each as its table row: by median
    confirmed ratio among the variants most passes confirmed (its median pass's row), or where
    none is confirmed, by the sweep's ratio (`load_best` takes the first)."""
    group = _fully_compared(group)
    confirmed = group[group["_confirm"] & group["ratio"].notna()]
    if not confirmed.empty:
        method = next(m for m in (*RANKING, *confirmed["method"]) if (confirmed["method"] == m).any())
        confirmed = confirmed[confirmed["method"] == method]
    if confirmed.empty:
        return _unconfirmed(group, regimed, top)
    passes = confirmed.groupby(_VARIANT)["strongest_ratio"]
    enough = passes.count() >= math.ceil(passes.count().max() / 2)
    medians = passes.median()[enough].sort_values(ascending=False, kind="stable")
    out = []
    for key in medians.index[:top]:
        runs = confirmed.set_index(_VARIANT).loc[[key]].reset_index().sort_values("strongest_ratio")
        row = runs.iloc[(len(runs) - 1) // 2].copy()  # the median pass (the lower one of an even count)
        row["strongest_ratio"] = float(medians[key])
        row["ratio"] = float(runs["ratio"].median())
        row["confirm_passes"] = len(runs)
        row["ratio_low"], row["ratio_high"] = float(runs["ratio"].min()), float(runs["ratio"].max())
        out.append(_with_regimes(row, runs if method == TimingMethod.SUSTAINED.value else None, regimed))
    return out


def _unconfirmed(group: pd.DataFrame, regimed: pd.DataFrame, top: int) -> list[pd.Series]:
    """A problem's `top` leading variants by the sweep's ratio (to the strongest torch path), each
    its best row, unconfirmed."""
    ranked = group.assign(_rank=group["strongest_ratio"].fillna(0.0)).sort_values(
        ["_rank", "tflops"], ascending=False).drop_duplicates(_VARIANT).head(top)
    out = []
    for _, row in ranked.drop(columns="_rank").iterrows():
        row = row.copy()
        row["confirm_passes"], row["ratio_low"], row["ratio_high"] = 0, row["ratio"], row["ratio"]
        out.append(_with_regimes(row, None, regimed))
    return out


def load_candidates(source: str | Path, top: int) -> pd.DataFrame:
    """Per (GPU, problem) of a store, its `top` leading kernel variants as table rows, best first
    (the first is `load_best`'s row: a problem's in-model choice first where it has one): the
    candidates `tune-model` times inside a model.

    Raises:
        BestTableError, StoreError: as `load_best` for a store; a source that is no store.
    """
    url = store_url_of(source)
    if url is None:
        raise BestTableError(f"{source}: the candidates come from a store (a .sqlite file or store URL)")
    return _picked(_kernel_frame(url), top)


def _with_regimes(row: pd.Series, sustained: pd.DataFrame | None, regimed: pd.DataFrame) -> pd.Series:
    """`row` (a problem's pick) with its `REGIME_COLUMNS`: the sustained ones from its sustained
    confirm passes (`sustained`, None where it has none), each other regime's from the rows of the
    same kernel measured in it (`regimed`), the medians over their passes; of a regime confirmed
    with several parameters (two gap lengths), those of the last run. The kernel's rows of the
    row's own run-time variant come first; where that variant was not measured in a regime, those
    of the kernel's other run-time variants give its figures (their last run's): `confirm
    --regime` times the candidates by sweep ratio, and the pick, by median confirmed ratio, may
    be another raster or swizzle of the same kernel, whose figures in the regime differ from it
    by what a run-time argument changes, where none would be shown at all. The in-model and
    call-site columns start empty (`_in_model_pick` and `check` fill them)."""
    row = row.copy()
    for c in REGIME_COLUMNS:
        row[c] = "" if c.endswith("_regime") else math.nan
    row["call_site_ratio"], row["call_site_regime"] = math.nan, ""
    found = {Regime.SUSTAINED: sustained}
    kernel = regimed[(regimed["gpu"] == row["gpu"]) & (regimed["problem"] == row["problem"])
                     & (regimed["config_hash"] == row["config_hash"])]
    variant = kernel["runtime"] == row["runtime"]
    for regime in Regime:
        if regime is Regime.SUSTAINED or not regime.in_bench:
            continue
        of_regime = kernel["_regime"].map(lambda name, r=regime: name.partition(":")[0] == r.value).astype(bool)
        mine = kernel[of_regime & variant]
        if mine["ratio"].isna().all():
            mine = kernel[of_regime & ~variant]
            mine = mine[mine["run_id"] == mine["run_id"].iloc[-1]] if not mine.empty else mine
        if not mine.empty:
            found[regime] = mine[mine["_regime"] == mine["_regime"].iloc[-1]]
    for regime, runs in found.items():
        if runs is None or runs["ratio"].isna().all():
            continue
        col = regime.column
        row[f"{col}_regime"] = str(runs["_regime"].iloc[-1])
        row[f"{col}_ratio"] = float(runs["ratio"].median())
        row[f"{col}_sm_mhz"], row[f"{col}_power_w"] = float(runs["_sm_mhz"].median()), float(runs["_power_w"].median())
    return row


_SIDE_RATIOS = ("torch_compile_ratio", "cublaslt_ratio")
"""A row's ratios to the torch paths timed beside its baseline (NaN where its pass timed none)."""


def _fully_compared(group: pd.DataFrame) -> pd.DataFrame:
    """A problem's rows, less those whose pass timed fewer of its torch paths than another pass
    did: a side its pass could not time (not built then, or its baseline failed its own check)
    leaves that row's strongest the fastest of the others, so such rows would rank and median
    with a ratio to a weaker baseline than the problem has."""
    for column in _SIDE_RATIOS:
        timed = group[column].notna()
        if timed.any():
            group = group[timed]
    return group


@dataclasses.dataclass(frozen=True)
class _PassFigures:
    """What one pass's baseline row says of the torch paths timed in its loop: each side's
    TFLOP/s and the baseline's median over its median (`Measurement.side_ratio`), and the
    strongest (`Measurement.strongest`). A kernel's ratio to a side is its ratio to the
    baseline over that factor. The defaults are a pass with its baseline alone."""

    strongest: str
    strongest_factor: float = 1.0
    compile_tflops: float = math.nan
    compile_factor: float = math.nan
    lt_tflops: float = math.nan
    lt_factor: float = math.nan


def _pass_figures(rows: list[StoredRow], measurements: list[Measurement]) -> dict[tuple, _PassFigures]:
    """By (gpu, problem, run, pass), the torch paths its baseline row timed (`_PassFigures`); of a
    pass with several baseline rows, the one with the median strongest factor."""
    found: dict[tuple, list[_PassFigures]] = {}
    for r, m in zip(rows, measurements):
        strongest = m.strongest() if m.is_baseline else None
        if strongest is None:
            continue
        side, factor = strongest
        figures = _PassFigures(
            strongest=side.value, strongest_factor=factor,
            **{f"{name}_{what}": value if value is not None else math.nan
               for name, kind in (("compile", Baseline.COMPILE), ("lt", Baseline.CUBLASLT))
               for what, value in (("tflops", m.side_tflops(kind)), ("factor", m.side_ratio(kind)))})
        found.setdefault((r.gpu, r.problem, r.run_id, m.repeat), []).append(figures)
    return {key: sorted(v, key=lambda f: f.strongest_factor)[(len(v) - 1) // 2] for key, v in found.items()}


def load_best(source: str | Path) -> pd.DataFrame:
    """The best verified kernel per (GPU, problem), with the columns of `cutlass_tune.tables`.

    Args:
        source: a store URL (`sqlite:///...`, `postgresql+psycopg://...`), a `.sqlite` file (or
            a gzip-compressed `.sqlite.gz`, read from a temporary copy), a
            table written by `cutlass-tune best` (`.csv`, `.json`, `.parquet`), or a bundle
            directory written by `cutlass-tune export`.

    Raises:
        BestTableError: no such file; a file that cannot be read as a table, lacks a column, has
            no rows or a value that is not of its column's kind (the message names the row and
            column); an empty store, a store with no successful measurement, or a stored
            measurement that cannot be read.
        BundleError: a bundle whose files do not match its manifest.
        StoreError: no such SQLite store, the store cannot be reached, or is of another schema version.
    """
    if is_compressed_store(source):  # a committed `.sqlite.gz`: read from a decompressed copy
        with readable_store(source) as copy:
            return _from_store(str(copy))
    url = store_url_of(source)
    if url is not None:
        return _from_store(url)
    return read_local(source)[0]
