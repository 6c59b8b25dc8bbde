"""Lookups into a best-config table: the tuned problem nearest to the one asked for."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import numbers
import operator
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..measurement import TimingMethod
from ..regime import Regime
from ..space import (
    Activation,
    Decomposition,
    DType,
    Epilogue,
    KernelConfig,
    Layout,
    Operation,
    RasterOrder,
    RuntimeArgs,
    Scaling,
    layout_code,
)
from ..tables import NO_ROUTING, TABLE_SUFFIXES, BestTableError, BundledKernel, is_bundle, read_local

if TYPE_CHECKING:
    from ._dispatch import Ready

_TORCH_NAMES = {"torch.bfloat16": DType.BF16, "torch.float16": DType.F16, "torch.float32": DType.F32,
                "torch.float8_e4m3fn": DType.E4M3, "torch.float8_e5m2": DType.E5M2}
"""torch's dtypes by name: a lookup takes them without this module importing torch."""
_TORCH_SPELLINGS = {**_TORCH_NAMES, **{name.removeprefix("torch."): d for name, d in _TORCH_NAMES.items()}}
"""A dtype given as the text of a torch dtype, with or without "torch." ("bfloat16", "torch.float16")."""
_LAYOUTS = {layout_code(a, b) for a in Layout for b in Layout}


def _dtype_value(value: object, name: str) -> str:
    """The table's spelling of a dtype given as its spelling, a `DType` or a torch.dtype."""
    if isinstance(value, DType):
        return value.value
    if isinstance(value, str):
        if value in {d.value for d in DType}:
            return value
        if value in _TORCH_SPELLINGS:
            return _TORCH_SPELLINGS[value].value
    elif type(value).__name__ == "dtype" and str(value) in _TORCH_NAMES:
        return _TORCH_NAMES[str(value)].value
    known = ", ".join(d.value for d in DType)
    raise BestTableError(f"lookup: {name} {str(value)[:40]!r} is not a dtype of the tables ({known}, or the torch "
                         "dtypes bfloat16, float16, float32, float8_e4m3fn, float8_e5m2, as dtypes or their names)")


def _fused(epilogue: object, scaling: object) -> tuple[str, str]:
    """The table's spellings of an epilogue and a scaling given as themselves or their names."""
    if isinstance(epilogue, Epilogue):
        epilogue = epilogue.name
    elif isinstance(epilogue, Activation):  # an activation alone: its epilogue without bias
        epilogue = Epilogue(activation=epilogue).name
    if not isinstance(epilogue, str):
        raise BestTableError(f"lookup: epilogue {str(epilogue)[:40]!r} is not an Epilogue or its name")
    try:
        epilogue = Epilogue.parse(epilogue).name
    except ValueError as err:
        raise BestTableError(f"lookup: {err}") from err
    scaling = scaling.value if isinstance(scaling, Scaling) else scaling
    if scaling not in {s.value for s in Scaling}:
        raise BestTableError(f"lookup: scaling {str(scaling)[:40]!r} is not one of "
                             f"{', '.join(s.value for s in Scaling)}")
    return epilogue, str(scaling)


def _shown_operation(epilogue: str, scaling: str) -> str:
    """" bias+silu", " scale-rowcol": what follows the dtypes and layout in a lookup's message."""
    return (f" {epilogue}" if epilogue != "none" else "") + (f" scale-{scaling}" if scaling != "none" else "")


def _sizes(**sizes: object) -> tuple[int, ...]:
    """The sizes of a lookup as ints: each a positive whole number (an int, a numpy integer, or
    a float of a whole value), else a one-line BestTableError naming it (NaN, inf, 2.5, -1, "8")."""
    out = []
    for name, value in sizes.items():
        whole = (isinstance(value, numbers.Integral) or (isinstance(value, numbers.Real) and math.isfinite(value)
                                                         and float(value).is_integer()))
        if isinstance(value, bool) or not whole or int(value) <= 0:  # type: ignore[call-overload]
            raise BestTableError(f"lookup: {name} {str(value)[:40]!r} is not a positive whole number")
        out.append(int(value))  # type: ignore[call-overload]
    return tuple(out)


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
    def ratio(self) -> float:
        """The row's speed relative to its torch baseline (>1: the kernel is faster), NaN where
        the row has none."""
        try:
            return float(self.row.get("ratio"))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return math.nan

    def _figure(self, column: str) -> float:
        try:
            return float(self.row.get(column))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return math.nan

    def dispatch_ratio(self, claim: float | None = None) -> tuple[float, str]:
        """The figure the dispatcher holds `min_ratio` against, and where it comes from ("" for
        the claim itself, else words to follow "measured at 0.970x torch"). In this order, the
        first the row has:

        1. `in_model_ratio`: the kernel's ratio inside the user's model step (`tune-model`, the
           in-model regime's ratio: a table from a store holds it where `tune-model --storage`
           recorded it);
        2. `call_site_ratio`: what `check` measured through `matmul` in its regime, where it is
           below the claim (an entry flagged below its claim is held to what it delivered; a
           call-site figure above the claim leaves the claim);
        3. the lowest of the claim and the bench regimes' ratios (`REGIME_COLUMNS`): a kernel
           chosen at the power cap must also beat torch in each regime it was confirmed in;
        4. none (NaN) where the claim is single launches' (`method` "events": a sweep's, or a
           confirm by events), which read up to 8% above what a caller gets
           (benchmarks/sustained.md): such a row runs only under `min_ratio` 0.

        Args:
            claim: the sweep's or confirm's ratio to the path torch runs instead (default `ratio`).
        """
        claim = self.ratio if claim is None else claim
        in_model = self._figure(f"{Regime.IN_MODEL.column}_ratio")
        if math.isfinite(in_model):
            regime = str(self.row.get(f"{Regime.IN_MODEL.column}_regime") or "")
            return in_model, f" inside the model{f' ({regime})' if regime else ''} (its claim {claim:.3f})"
        call_site = self._figure("call_site_ratio")
        if math.isfinite(call_site):
            # A call-site figure can hold a kernel below its claim, never lift it above: one
            # check's figure is a single measurement, and a wrong one must not turn a kernel on.
            regime = str(self.row.get("call_site_regime") or "")
            return min(call_site, claim), f" at the call site{f' ({regime})' if regime else ''} (its claim {claim:.3f})"
        if str(self.row.get("method") or "") == TimingMethod.EVENTS.value:
            return math.nan, (f" only by single launches (its claim {claim:.3f}; `cutlass-tune confirm` measures it as "
                              "a model calls it)")
        lowest, source = claim, ""
        for regime in Regime:
            figure = self._figure(f"{regime.column}_ratio")
            if regime is not Regime.SUSTAINED and regime.in_bench and math.isfinite(figure) and not figure >= lowest:
                lowest = figure
                source = f" in regime {self.row.get(f'{regime.column}_regime') or regime.value} (its claim {claim:.3f})"
        return lowest, source

    @property
    def runtime(self) -> RuntimeArgs:
        return RuntimeArgs(raster=RasterOrder[self.row["raster"].upper()], swizzle=int(self.row["swizzle"]),
                           splits=int(self.row["splits"]),
                           decomposition=Decomposition[self.row["decomposition"].upper()])

    def __repr__(self) -> str:
        # The row itself is a 90-column Series: a repr of it buried the four facts a reader wants.
        row = self.row
        return (f"Match(problem={str(row.get('problem'))!r}, kernel={str(row.get('kernel'))!r}, "
                f"ratio={self.ratio:.3f}, exact={self.exact})")


NATIVE_BUNDLES: list[Path] = []
"""The bundles loaded so far, where the operators' native library may be found for this torch
(`_native.load`; a bundle carries it per torch ABI)."""


class PlanCache:
    """The plans of one table by call signature (`cutlass_tune.runtime.Call.signature`), each as the
    dispatcher's `Ready`. Thread-safe: a lookup is one dict read; writers take a lock. Keyed on
    the signature tuple, not on `Call`: building a frozen dataclass per call costs more than the
    whole lookup (benchmarks/host_path.md). Here, beside the table, so that a table and its
    lookups import no torch (the dispatcher does)."""

    def __init__(self) -> None:
        self._entries: dict[tuple, Ready] = {}
        self._lock = threading.Lock()
        self.get = self._entries.get
        self.native_key: str | None = None
        """The key of the native library's plans for this table's function doors (`_native.door_key`)."""
        self.on_clear: Callable[[], None] | None = None
        """Called by `clear`: the native library forgets its copies of the plans."""

    def put(self, signature: tuple, ready: Ready) -> Ready:
        with self._lock:
            self._entries[signature] = ready
        return ready

    def entries(self) -> list[Ready]:
        with self._lock:
            return list(self._entries.values())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
        if self.on_clear is not None:
            self.on_clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[tuple]:
        return iter(list(self._entries))


def _matching(frame: pd.DataFrame, wanted: Mapping[str, str]) -> pd.DataFrame:
    """The rows of `frame` whose operation columns hold `wanted`; none from a table without rows
    (a `BestTable(pd.DataFrame())`, torch's path everywhere, has no columns to compare)."""
    if frame.empty or any(c not in frame.columns for c in wanted):
        return frame.iloc[:0]
    return frame[functools.reduce(operator.and_, (frame[c] == v for c, v in wanted.items()))]


_objects = itertools.count(1)
_traced_tables: weakref.WeakValueDictionary[str, BestTable] = weakref.WeakValueDictionary()
"""The live tables by `trace_key`."""


def traced_table(key: str) -> BestTable:
    """The live table whose `trace_key` is `key` (KeyError where it was collected)."""
    return _traced_tables[key]


class BestTable:
    """Lookups into a best-config table (a DataFrame of the columns of `cutlass_tune.tables`).

    `bundled`: the compiled kernels of a bundle by config hash (`matmul` loads these instead of
    compiling); empty for a table from a store or file.
    """

    def __init__(self, frame: pd.DataFrame, gpu: str | None = None,
                 bundled: Mapping[str, BundledKernel] | None = None, *, source: str | Path | None = None):
        if gpu is not None:
            frame = frame[frame["gpu"] == gpu]
        # A frame built before fused epilogues (or by hand) holds plain GEMMs.
        frame = frame.assign(**{c: "none" for c in Operation.ADDED_LATER if c not in frame.columns})
        frame = frame if "groups" in frame.columns else frame.assign(groups=0)
        frame = frame if "routing" in frame.columns else frame.assign(routing=NO_ROUTING)
        self.frame = frame.reset_index(drop=True)
        self.bundled = dict(bundled or {})
        self.source = None if source is None else str(source)
        """Where the table was read from (`load`'s source), None for one built from a frame."""
        self.plans: PlanCache = PlanCache()
        """The plans of the calls run on this table, by call signature (`cutlass_tune.runtime._dispatch`)."""
        self._devices: dict[int, BestTable] = {}  # the rows each CUDA device may use (runtime's device_table)
        self.trace_key = f"table-object-{next(_objects)}"
        """A name of this table unique in the process, which torch.compile reads as a constant
        (`matmul` traced binds the table to it: `_op.compiled_matmul`)."""
        _traced_tables[self.trace_key] = self

    @property
    def gpus(self) -> list[str]:
        """The GPU models the table's rows were tuned on, sorted ("" for rows that name none)."""
        return sorted({str(g) for g in self.frame["gpu"]}) if "gpu" in self.frame.columns else []

    def for_gpu(self, name: str) -> BestTable:
        """The rows tuned on the GPU model `name` (as CUDA names it, e.g. "NVIDIA H100 80GB HBM3")
        and those that name no GPU (a table built by hand), with the same bundled kernels: the
        kernels a device of that model may run. A kernel's speed, and so the table's choice, was
        measured on its own GPU model only."""
        if "gpu" not in self.frame.columns:
            return self
        gpu = self.frame["gpu"].fillna("").astype(str)
        return BestTable(self.frame[(gpu == name) | (gpu == "")], bundled=self.bundled, source=self.source)

    @classmethod
    def load(cls, source: str | Path, gpu: str | None = None) -> BestTable:
        """The best-config table of `source`, as `cutlass_tune.load_best` reads it; a bundle
        brings its compiled kernels along.

        A bundle directory or a table file is read here; any other source (a store) is read by
        the tuner's `load_best`, imported only then: a serving host that loads bundles and table
        files never imports the store and its dependencies.

        Raises:
            BestTableError, BundleError, StoreError: as `cutlass_tune.load_best`.
        """
        if is_bundle(source) or Path(source).suffix in TABLE_SUFFIXES:
            frame, bundled = read_local(source)
            if bundled and Path(source) not in NATIVE_BUNDLES:
                NATIVE_BUNDLES.append(Path(source))
            return cls(frame, gpu=gpu, bundled=bundled, source=source)
        from ..report import load_best  # the tuner's store reader (SQLAlchemy, Optuna): for stores only

        return cls(load_best(source), gpu=gpu, source=source)

    def operations(self) -> list[str]:
        """The operations the table holds rows of, by name ("bf16bf16bf16_tn", ..._grouped), sorted."""
        f = self.frame
        if f.empty:
            return []
        cells = f[["dtype_a", "dtype_b", "dtype_d", "layout", "epilogue", "scaling", "grouping"]].drop_duplicates()
        names = set()
        for row in cells.to_dict("records"):
            try:
                names.add(Operation.from_cells(row).name)
            except (KeyError, ValueError):  # a row of a kind this version does not know
                names.add(f"{row['dtype_a']}{row['dtype_b']}{row['dtype_d']}_{row['layout']}?")
        return sorted(names)

    def __repr__(self) -> str:
        operations = self.operations()
        shown = ", ".join(operations[:4]) + (f", +{len(operations) - 4} more" if len(operations) > 4 else "")
        bundled = f", bundled={len(self.bundled)}" if self.bundled else ""
        return (f"BestTable(source={self.source!r}, rows={len(self.frame)}, gpus={self.gpus}, "
                f"operations=[{shown}]{bundled})")

    def find(self, m: int, n: int, k: int, operation: Operation, *, groups: int = 0) -> Match:
        """The row for M x N x K of `operation` (a problem's), or the nearest tuned problem of
        that operation on a log scale (`exact` False): `matmul`'s dispatch.

        A grouped operation (`grouped_mm`'s dispatch) takes `groups` experts of N x K weights
        and M routed rows: rows of the same operation and the same experts, N and K, the
        nearest routed rows M among them (a kernel tuned for other experts' shapes is not
        looked for: their per-group GEMMs differ).

        Raises:
            BestTableError: nothing tuned for the operation (for a grouped one: for these
                experts, N and K), or a size that is not a positive whole number (NaN, inf, -1, 2.5).
        """
        if operation.grouped:
            return self._nearest_rows(m, n, k, groups, operation.operation.cells())
        return self._nearest(m, n, k, operation.operation.cells())

    def _nearest_rows(self, m: int, n: int, k: int, groups: int, wanted: Mapping[str, str]) -> Match:
        """The grouped row of `groups` experts, N and K whose routed rows are nearest M (log scale)."""
        m, n, k, groups = _sizes(m=m, n=n, k=k, groups=groups)
        same = _matching(self.frame, wanted)
        experts = same[(same["groups"] == groups) & (same["n"] == n) & (same["k"] == k)] if not same.empty else same
        if experts.empty:
            tuned = sorted({f"{e} experts of {nn}x{kk}" for e, nn, kk in zip(same["groups"], same["n"], same["k"])}) \
                if not same.empty else []
            raise BestTableError(f"no tuned grouped problem of {groups} experts of {n}x{k} for {wanted['dtype_a']} "
                                 f"{wanted['layout']} (the table has: {', '.join(tuned) or 'none'})")
        distance = (experts["m"].map(math.log2) - math.log2(m)).abs()
        best: Any = distance.idxmin()  # an index label
        return Match(row=experts.loc[best], exact=bool(distance[best] == 0.0), distance=float(distance[best]))

    def lookup(self, m: int, n: int, k: int, dtype: object = "bf16", layout: str = "tn",
               out_dtype: object = None, epilogue: Epilogue | str = "none", scaling: Scaling | str = "none") -> Match:
        """The row for M x N x K, or the nearest tuned problem of the same dtypes, layout,
        epilogue and scaling on a log scale (`exact` False); single GEMMs only (`find` looks
        grouped ones up).

        The epilogue and scaling are what the kernel computes, so they match exactly: a plain
        row never answers a bias+silu lookup, nor the reverse.

        Args:
            dtype: the input type (`dtype_a`): bf16, f16, e4m3, e5m2, a `DType`, or the torch dtype.
            layout: BLAS two letters (tn, nt, nn, tt).
            out_dtype: the output type (`dtype_d`), spelt as `dtype`; None takes rows of any output type.
            epilogue: an `Epilogue` or its name ("none", "bias", "bias+silu", ...).
            scaling: a `Scaling` or its value (none, tensor, rowcol).

        Raises:
            BestTableError: nothing tuned for these dtypes, layout, epilogue and scaling; a
                dtype, layout, epilogue or scaling that is none; or a size that is not a positive
                whole number (NaN, inf, -1, 2.5).
        """
        dtype = _dtype_value(dtype, "dtype")
        if layout not in _LAYOUTS:
            raise BestTableError(f"lookup: layout {str(layout)[:40]!r} is not one of {', '.join(sorted(_LAYOUTS))}")
        epilogue, scaling = _fused(epilogue, scaling)
        wanted = {"dtype_a": dtype, "layout": layout, "epilogue": epilogue, "scaling": scaling, "grouping": "none"}
        if out_dtype is not None:
            wanted["dtype_d"] = _dtype_value(out_dtype, "out_dtype")
        return self._nearest(m, n, k, wanted)

    def _nearest(self, m: int, n: int, k: int, wanted: Mapping[str, str]) -> Match:
        """The row nearest to M x N x K among those whose operation columns hold `wanted`."""
        m, n, k = _sizes(m=m, n=n, k=k)
        f = self.frame
        same = _matching(f, wanted)
        if same.empty:
            tuned = sorted({f"{a} -> {d} {lay}{_shown_operation(e, s)}" for a, d, lay, e, s
                            in zip(f["dtype_a"], f["dtype_d"], f["layout"], f["epilogue"], f["scaling"])}) \
                if not f.empty else []
            asked = wanted["dtype_a"] + (f" -> {wanted['dtype_d']}" if "dtype_d" in wanted else "")
            raise BestTableError(f"no tuned problem for {asked} {wanted['layout']}"
                                 f"{_shown_operation(wanted['epilogue'], wanted['scaling'])} "
                                 f"(the table has: {', '.join(tuned) or 'none'})")
        distance = same.apply(lambda r: math.dist((math.log2(m), math.log2(n), math.log2(k)),
                                                  (math.log2(r["m"]), math.log2(r["n"]), math.log2(r["k"]))), axis=1)
        best: Any = distance.idxmin()  # an index label
        return Match(row=same.loc[best], exact=bool(distance[best] == 0.0), distance=float(distance[best]))
