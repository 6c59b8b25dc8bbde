"""Best-config tables: the best verified kernel per (GPU, problem), and lookups into them.

Schema of the DataFrame `load_best` returns (one row per GPU and problem):

| column | meaning |
|---|---|
| gpu | GPU model the figures were measured on |
| problem, m, n, k, dtype_a, dtype_b, dtype_d, layout | the GEMM (layout: BLAS two letters, e.g. tn) |
| kernel, config_hash | name and content hash of the winning `KernelConfig` |
| runtime, raster, swizzle, splits, decomposition | its best run-time variant |
| tflops, median_ms, p20_ms, p80_ms, samples | its timing (median; L2-cold CUDA events, or CUDA-graph replays where the store was swept with `--graph`) |
| spread | (p80 - p20) / median |
| cublas_tflops, ratio | cuBLAS in the same run (sampled alternately with the kernel where the store pairs baselines), and tflops / cublas_tflops |
| tile_m ... tile_scheduler, fp8_fast_accum, epilogue_tile_n, epilogue_source | the config's knobs, one column each (stages and epilogue_tile_n 0: auto) |
| config | the config as JSON (`KernelConfig.from_dict(json.loads(...))` rebuilds it) |
| run_id | the run that measured it |
| sweep_ratio | the best ratio the sweep measured for this kernel and variant |
| confirm_passes | passes of `cutlass-tune confirm` that measured it (0: not confirmed) |
| ratio_low, ratio_high | lowest and highest confirmed ratio (both `ratio` when not confirmed) |

The best is chosen by `ratio`: figures from different runs are compared through their
same-run cuBLAS baselines, never as absolute TFLOP/s. Where `cutlass-tune confirm` re-measured
a problem's leading candidates, the best is the candidate with the highest median confirmed
ratio, and `ratio` is that median (a sweep's best is the largest of many noisy medians, so it
reads high). A kernel that ever gave a wrong result on a problem, with any run-time variant,
is never that problem's best.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import pandas as pd

from ..errors import CutlassTuneError, first_line
from ..space import KernelConfig, RuntimeArgs
from ..status import Status
from ..store import store_url_of

if TYPE_CHECKING:
    from ._bundle import BundledKernel

KNOB_COLUMNS = ("tile_m", "tile_n", "tile_k", "cluster_m", "cluster_n", "stages", "kernel_schedule",
                "epilogue_schedule", "tile_scheduler", "fp8_fast_accum", "epilogue_tile_n", "epilogue_source")
_LATER_KNOBS = ("fp8_fast_accum", "epilogue_tile_n", "epilogue_source")
"""Knob columns that tables written before them lack; `load_best` fills them from `config`."""


def _knob_values(cfg: KernelConfig) -> dict:
    return {k: (v.value if hasattr(v, "value") else v) for k in KNOB_COLUMNS for v in (getattr(cfg, k),)}
COLUMNS = ("gpu", "problem", "m", "n", "k", "dtype_a", "dtype_b", "dtype_d", "layout", "kernel",
           "config_hash", "runtime", "raster", "swizzle", "splits", "decomposition", "tflops", "median_ms",
           "p20_ms", "p80_ms", "samples", "spread", "cublas_tflops", "ratio", *KNOB_COLUMNS, "config",
           "run_id", "sweep_ratio", "confirm_passes", "ratio_low", "ratio_high")
_CONFIRM_COLUMNS = ("sweep_ratio", "confirm_passes", "ratio_low", "ratio_high")


class BestTableError(CutlassTuneError):
    """A best-config table cannot be built or read, or has no entry for a lookup."""


def _measurements(store, url: str, rows: list[dict]) -> list:
    """The Measurement of each of `rows` (store rows with their `id`), rebuilt from its
    `record`; a record that cannot be rebuilt is a BestTableError naming its row."""
    from ..measurement import Measurement

    records = {r["id"]: r["record"] for r in store.rows(["id", "record"])}
    out = []
    for r in rows:
        try:
            out.append(Measurement.from_dict(json.loads(records[r["id"]])))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise BestTableError(f"store {url}: measurement {r['id']} ({r['kernel']} on {r['problem']}) "
                                 f"cannot be read: {type(err).__name__}: {first_line(err)}") from err
    return out


_STORE_NUMBERS = ("tflops", "median_ms", "p20_ms", "p80_ms", "cublas_tflops", "ratio")


def _from_store(url: str) -> pd.DataFrame:
    from ..store import ResultStore

    local = _local_file(url)
    if local is not None and not local.exists():  # (looking into it would make an empty file)
        raise BestTableError(f"no store at {url}")
    store = ResultStore(url)
    # StoreError, not BestTableError: the dashboard shows a store whose best table cannot be
    # built (BestTableError) with an empty one, but must not read a store of another schema.
    store.check_schema()
    rows = store.rows()
    measurements = _measurements(store, url, rows)
    kernels = [m for m in measurements if not m.is_baseline and m.config is not None]
    if not kernels:
        raise BestTableError(f"store {url} has no measurements: run `cutlass-tune sweep` first")
    if not any(r["status"] == Status.OK.value and r["kernel"] != "cuBLAS" for r in rows):
        reasons = pd.Series([f"{r['status']}: {r['reason']}" for r in rows if r["kernel"] != "cuBLAS"])
        raise BestTableError(f"store {url} has no successful measurement: {len(reasons)} failed "
                             f"(most common: {reasons.value_counts().index[0][:120]})")
    from ..search import CONFIRM_STUDY

    wrong = {(r["gpu"], r["problem"], r["config_hash"]) for r in rows if r["status"] == Status.WRONG_RESULT.value}
    out = []
    for r, m in zip(rows, measurements):
        if r["status"] != Status.OK.value or m.is_baseline or m.config is None or not r["tflops"]:
            continue
        if (r["gpu"], r["problem"], r["config_hash"]) in wrong:
            continue
        out.append({
            **{c: r[c] for c in ("gpu", "problem", "m", "n", "k", "dtype_a", "dtype_b", "dtype_d", "layout",
                                 "kernel", "config_hash", "runtime", "tflops", "median_ms", "p20_ms",
                                 "p80_ms", "samples", "cublas_tflops", "ratio", "run_id")},
            "raster": m.runtime.raster.name.lower(), "swizzle": m.runtime.swizzle,
            "splits": m.runtime.splits, "decomposition": m.runtime.decomposition.name.lower(),
            **_knob_values(m.config),
            "config": json.dumps(m.config.to_dict(), sort_keys=True),
            "_confirm": r["study"] == CONFIRM_STUDY,
        })
    if not out:
        raise BestTableError(f"store {url} has no kernel that verified every time it ran")
    frame = pd.DataFrame(out)
    # NULLs (a kernel of an unpaired store without a cuBLAS figure has no ratio) become NaN:
    # every figure is a float, which ranks (NaN ratios last) and formats ("nan") like one.
    frame = frame.assign(**{c: pd.to_numeric(frame[c]).astype(float) for c in _STORE_NUMBERS})
    frame["spread"] = (frame["p80_ms"] - frame["p20_ms"]) / frame["median_ms"]
    variant = ["gpu", "problem", "config_hash", "runtime"]
    sweep = frame[~frame["_confirm"]]
    sweep_best = sweep.groupby(variant)["ratio"].max().rename("sweep_ratio")
    picked = []
    for _, group in frame.groupby(["gpu", "problem"], sort=False):
        confirmed = group[group["_confirm"] & group["ratio"].notna()]
        if confirmed.empty:
            row = group.assign(_rank=group["ratio"].fillna(0.0)).sort_values(
                ["_rank", "tflops"], ascending=False).iloc[0].copy()
            row["confirm_passes"], row["ratio_low"], row["ratio_high"] = 0, row["ratio"], row["ratio"]
            picked.append(row)
            continue
        passes = confirmed.groupby(variant)["ratio"]
        enough = passes.count() >= math.ceil(passes.count().max() / 2)
        medians = passes.median()[enough]
        key = medians.idxmax()
        runs = confirmed.set_index(variant).loc[[key]].reset_index().sort_values("ratio")
        row = runs.iloc[(len(runs) - 1) // 2].copy()  # the median pass (the lower one of an even count)
        row["ratio"] = float(medians[key])
        row["confirm_passes"] = len(runs)
        row["ratio_low"], row["ratio_high"] = float(runs["ratio"].min()), float(runs["ratio"].max())
        picked.append(row)
    best = pd.DataFrame(picked).drop(columns=["_confirm"])
    best = best.join(sweep_best, on=variant)
    best["sweep_ratio"] = best["sweep_ratio"].fillna(best["ratio"])
    best["confirm_passes"] = best["confirm_passes"].astype(int)
    best = best.sort_values(["gpu", "m", "n", "k", "problem"], kind="stable")
    return best[list(COLUMNS)].reset_index(drop=True)


def load_best(source: str | Path) -> pd.DataFrame:
    """The best verified kernel per (GPU, problem), with the schema in this module's docstring.

    Args:
        source: a store URL (`sqlite:///...`, `postgresql+psycopg://...`), a `.sqlite` file, a
            table written by `cutlass-tune best` (`.csv`, `.json`, `.parquet`), or a bundle
            directory written by `cutlass-tune export`.

    Raises:
        BestTableError: no such file; a file that cannot be read as a table, lacks a column, has
            no rows or a value that is not of its column's kind (the message names the row and
            column); an empty store, a store with no successful measurement, or a stored
            measurement that cannot be read.
        BundleError: a bundle whose files do not match its manifest.
        StoreError: the store cannot be reached, or is of another schema version.
    """
    from ._bundle import is_bundle, read_bundle
    from ._table_file import read_table

    url = store_url_of(source)
    if url is not None:
        return _from_store(url)
    path = Path(source)
    if not path.exists():
        raise BestTableError(f"no best-config table at {path}")
    if is_bundle(path):
        return read_bundle(path)[0]
    return read_table(path)


def _local_file(source: str | Path) -> Path | None:
    """The file `source` names on this host: a path as it is, a SQLite store URL's database;
    None for a store on a server (or an in-memory one)."""
    url = store_url_of(source)
    if url is None:
        return Path(source)
    import sqlalchemy as sa

    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)



@dataclasses.dataclass(frozen=True)
class Match:
    """A lookup result: the table row, and whether it is the problem asked for."""

    row: pd.Series
    exact: bool
    distance: float
    """Euclidean distance in log2(M), log2(N), log2(K) between asked and tuned problem."""

    @property
    def config(self) -> KernelConfig:
        return KernelConfig.from_dict(json.loads(self.row["config"]))

    @property
    def runtime(self) -> RuntimeArgs:
        from ..space import Decomposition, RasterOrder

        return RuntimeArgs(raster=RasterOrder[self.row["raster"].upper()], swizzle=int(self.row["swizzle"]),
                           splits=int(self.row["splits"]),
                           decomposition=Decomposition[self.row["decomposition"].upper()])


class BestTable:
    """Lookups into a best-config table (`load_best`'s DataFrame).

    `bundled`: the compiled kernels of a bundle by config hash (`matmul` loads these instead of
    compiling); empty for a table from a store or file.
    """

    def __init__(self, frame: pd.DataFrame, gpu: str | None = None,
                 bundled: Mapping[str, BundledKernel] | None = None):
        if gpu is not None:
            frame = frame[frame["gpu"] == gpu]
        self.frame = frame.reset_index(drop=True)
        self.bundled = dict(bundled or {})
        self._kernels: dict[tuple, tuple] = {}  # matmul's resolved (kernel, problem) per tensor shape

    @classmethod
    def load(cls, source: str | Path, gpu: str | None = None) -> BestTable:
        """`load_best(source)` as a table; a bundle brings its compiled kernels along."""
        from ._bundle import is_bundle, read_bundle

        if store_url_of(source) is None and is_bundle(source):
            frame, bundled = read_bundle(source)
            return cls(frame, gpu=gpu, bundled=bundled)
        return cls(load_best(source), gpu=gpu)

    def lookup(self, m: int, n: int, k: int, dtype: str = "bf16", layout: str = "tn",
               out_dtype: str | None = None) -> Match:
        """The row for M x N x K, or the nearest tuned problem of the same dtypes and layout on a
        log scale (`exact` False).

        Args:
            dtype: the input type (`dtype_a`: bf16, f16, e4m3, e5m2).
            layout: BLAS two letters (tn, nt, nn, tt).
            out_dtype: the output type (`dtype_d`); None takes rows of any output type.

        Raises:
            BestTableError: nothing tuned for these dtypes and layout (or a non-positive size).
        """
        if min(m, n, k) <= 0:
            raise BestTableError(f"lookup of {m}x{n}x{k}: sizes must be positive")
        f = self.frame
        wanted = (f["dtype_a"] == dtype) & (f["layout"] == layout)
        if out_dtype is not None:
            wanted &= f["dtype_d"] == out_dtype
        same = f[wanted]
        if same.empty:
            tuned = sorted({f"{a} -> {d} {lay}" for a, d, lay in zip(f["dtype_a"], f["dtype_d"], f["layout"])})
            asked = f"{dtype} -> {out_dtype}" if out_dtype is not None else dtype
            raise BestTableError(f"no tuned problem for {asked} {layout} (the table has: {', '.join(tuned) or 'none'})")
        distance = same.apply(lambda r: math.dist((math.log2(m), math.log2(n), math.log2(k)),
                                                  (math.log2(r["m"]), math.log2(r["n"]), math.log2(r["k"]))), axis=1)
        best = distance.idxmin()
        return Match(row=same.loc[best], exact=bool(distance[best] == 0.0), distance=float(distance[best]))
