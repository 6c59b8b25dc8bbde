"""Best-config tables as files: reading one (.csv, .json or .parquet) and checking every value.
(`cutlass-tune best` writes them: report/_export.py.)
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .._files import InputTooLargeError, NotRegularFileError, read_input
from ..errors import first_line
from ..measurement import CONTENDERS, Baseline, TimingMethod
from ..regime import RegimeError, RegimeSpec
from ..space import (
    MAX_GROUPS,
    Activation,
    Decomposition,
    DType,
    Epilogue,
    Grouping,
    KernelConfig,
    RasterOrder,
    Routing,
    RuntimeArgs,
    Scaling,
    cells,
    check_runtime,
    column_kinds,
    columns,
    problem_dim_problem,
)
from ._schema import (
    COLUMNS,
    COMPILE_COLUMNS,
    CUBLASLT_COLUMNS,
    KNOB_COLUMNS,
    LATER_COLUMNS,
    LATER_KNOBS,
    NO_ROUTING,
    OPERATION_COLUMNS,
    REGIME_NUMBER_COLUMNS,
    REGIME_TEXT_COLUMNS,
    BestTableError,
)

_TEXT = ("gpu", "problem", "kernel", "config_hash", "runtime", "run_id")
_TEXT_COLUMNS = (*_TEXT, "dtype_a", "dtype_b", "dtype_d", "layout", "config", "method", "routing", "strongest",
                 *OPERATION_COLUMNS, *REGIME_TEXT_COLUMNS,
                 *(c for kinds in (column_kinds(RuntimeArgs), column_kinds(KernelConfig))
                   for c, kind in kinds.items() if kind == "text"))
"""Columns a CSV file's reader keeps as text (a config hash or run id of digits stays a string)."""


def _read_json(path: Path) -> pd.DataFrame:
    """A table as `write_table` writes it in JSON: a list of row objects. The values are taken
    as JSON has them (pandas' reader would turn a run id or config hash of digits into a
    number, and rounds some floats)."""
    data = json.loads(read_input(path).decode("utf-8"))
    if not isinstance(data, list):
        raise ValueError(f"expected a list of rows, found {_json_kind(data)}")
    for number, row in enumerate(data, 1):
        if not isinstance(row, dict):
            raise ValueError(f"row {number} is {_json_kind(row)}, not an object")
    return pd.DataFrame.from_records(data) if data else pd.DataFrame()


def _json_kind(value: Any) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "true or false", type(None): "null"}
    return kinds.get(type(value), "a number")


_READERS: dict[str, Callable[[Path], pd.DataFrame]] = {
    ".csv": lambda p: pd.read_csv(io.BytesIO(read_input(p)), dtype={c: str for c in _TEXT_COLUMNS}),
    ".json": _read_json,
    ".parquet": lambda p: pd.read_parquet(io.BytesIO(read_input(p))),
}
TABLE_SUFFIXES = tuple(_READERS)
"""The suffixes of the table files `read_table` reads."""


def _reader_errors() -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (ValueError, TypeError, KeyError, IndexError, OSError,
                                               NotImplementedError, OverflowError, RecursionError)
    try:
        import pyarrow

        errors += (pyarrow.ArrowException,)
    except ImportError:
        pass
    return errors


def _read_file(path: Path) -> pd.DataFrame:
    """The table in `path` as it is, or a one-line BestTableError naming the file and why not
    (its values are checked by `_check_rows`)."""
    kind = path.suffix[1:]
    try:
        frame = _READERS[path.suffix](path)
    except InputTooLargeError as err:
        raise BestTableError(f"cannot read {path}: {err}") from err
    except NotRegularFileError as err:
        raise BestTableError(f"cannot read {path}: {err.strerror}") from err
    except ImportError as err:
        raise BestTableError(f"cannot read {path}: reading {kind} needs pyarrow "
                             "(pip install 'cutlass-tune[parquet]')") from err
    except _reader_errors() as err:
        raise BestTableError(f"cannot read {path} as a {kind} table: {type(err).__name__}: {first_line(err)}") from err
    if not isinstance(frame, pd.DataFrame):
        raise BestTableError(f"cannot read {path} as a {kind} table: it holds no list of rows")
    return frame


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _as_number(v: Any) -> Any:
    """`v`, or the number a text `v` spells (a CSV column with one bad cell is read as text)."""
    if isinstance(v, str):
        for kind in (int, float):
            try:
                return kind(v.strip())
            except ValueError:
                pass
    return v


def _is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, (float, np.floating)) and math.isnan(v))


_INT64 = 2 ** 63
"""Whole numbers of a table are int64 columns once read (sizes and run-time values have
tighter bounds: the space's rules, checked after their kinds)."""


def _whole(v: Any, least: int, beyond: float = math.inf) -> bool:
    v = _as_number(v)
    return _is_number(v) and math.isfinite(v) and v == int(v) and least <= v < beyond


def _positive(v: Any) -> bool:
    v = _as_number(v)
    return _is_number(v) and math.isfinite(v) and v > 0


def _number_or_empty(v: Any) -> bool:
    v = _as_number(v)
    return _is_missing(v) or (_is_number(v) and math.isfinite(v))


_INTEGERS = ("m", "n", "k", "swizzle", "splits", "samples", "confirm_passes", "groups")
_POSITIVE = ("tflops", "median_ms")
_NUMBERS = ("p20_ms", "p80_ms", "spread", "cublas_tflops", "ratio", "sweep_ratio", "ratio_low", "ratio_high",
            "energy_mj", "cublas_energy_mj", *COMPILE_COLUMNS, *CUBLASLT_COLUMNS, "strongest_tflops",
            "strongest_ratio", *REGIME_NUMBER_COLUMNS)
_METHODS = ("", *(m.value for m in TimingMethod))
_DTYPES = tuple(sorted(d.value for d in DType))
_RASTERS = tuple(r.name.lower() for r in RasterOrder)
_DECOMPOSITIONS = tuple(d.name.lower() for d in Decomposition)
_LAYOUTS = ("tn", "nt", "nn", "tt")
_SCALINGS = tuple(s.value for s in Scaling)
_GROUPINGS = tuple(g.value for g in Grouping)
_ROUTINGS = (NO_ROUTING, *(r.value for r in Routing))
_STRONGEST = tuple(b.value for b in (Baseline.CUBLAS, *CONTENDERS[Baseline.EAGER], Baseline.GROUPED_MM,
                                      Baseline.EXPERT_LOOP))


def _regime_name(v: Any) -> bool:
    """Empty, or a regime as `RegimeSpec.name` spells it."""
    if _is_missing(v) or v == "":
        return True
    try:
        return isinstance(v, str) and RegimeSpec.parse(v).name == v
    except RegimeError:
        return False


def _epilogue_name(v: Any) -> bool:
    try:
        return isinstance(v, str) and Epilogue.parse(v).name == v
    except ValueError:
        return False


_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    **{c: (lambda v: isinstance(v, str) and v.strip() != "", "text") for c in _TEXT},
    **{c: (lambda v: _whole(v, 1), "a positive integer") for c in ("m", "n", "k", "swizzle", "splits")},
    **{c: (lambda v: _whole(v, 0, _INT64), "a whole number below 2**63") for c in ("samples", "confirm_passes")},
    **{c: (lambda v: isinstance(v, str) and v in _DTYPES, f"one of {', '.join(_DTYPES)}")
       for c in ("dtype_a", "dtype_b", "dtype_d")},
    "layout": (lambda v: isinstance(v, str) and v in _LAYOUTS, f"one of {', '.join(_LAYOUTS)}"),
    "epilogue": (_epilogue_name, "an epilogue (none, or parts such as bias+silu: bias, an activation "
                 f"of {', '.join(a.value for a in Activation if a is not Activation.NONE)}, residual, joined by "
                 "'+' in that order)"),
    "scaling": (lambda v: isinstance(v, str) and v in _SCALINGS, f"one of {', '.join(_SCALINGS)}"),
    "grouping": (lambda v: isinstance(v, str) and v in _GROUPINGS, f"one of {', '.join(_GROUPINGS)}"),
    "groups": (lambda v: _whole(v, 0, MAX_GROUPS + 1), f"a whole number from 0 to {MAX_GROUPS}"),
    "routing": (lambda v: isinstance(v, str) and v in _ROUTINGS, f"one of {', '.join(_ROUTINGS)}"),
    "strongest": (lambda v: isinstance(v, str) and v in _STRONGEST, f"one of {', '.join(_STRONGEST)}"),
    "method": (lambda v: _is_missing(v) or (isinstance(v, str) and v in _METHODS),
               f"empty or one of {', '.join(_METHODS[1:])}"),
    "raster": (lambda v: isinstance(v, str) and v in _RASTERS, f"one of {', '.join(_RASTERS)}"),
    "decomposition": (lambda v: isinstance(v, str) and v in _DECOMPOSITIONS, f"one of {', '.join(_DECOMPOSITIONS)}"),
    **{c: (_regime_name, "empty or a timing regime (sustained, idle-gap:200us, interleaved:64MiB, "
                         "as-captured:0.7:150us, in-model:compiled:4096)") for c in REGIME_TEXT_COLUMNS},
    **{c: (_positive, "a positive number") for c in _POSITIVE},
    # figures a store may lack (a kernel without a cuBLAS figure has no ratio): empty or a number
    **{c: (_number_or_empty, "a number") for c in _NUMBERS},
}


def _holds(check: Callable[[Any], bool], v: Any) -> bool:
    try:
        return bool(check(v))
    except (TypeError, ValueError):  # a list or array where a scalar belongs (a parquet file may hold one)
        return False
    except OverflowError:  # an integer beyond a float's range: 10**400
        return False


def _shown(v: Any) -> str:
    if _is_missing(v):
        return "(empty)"
    text = repr(v.item() if isinstance(v, np.generic) else v)
    return text if len(text) <= 60 else text[:57] + "..."


def _where(path: Path, number: int, problem: Any) -> str:
    named = f" ({problem})" if isinstance(problem, str) and problem.strip() and len(problem) <= 80 else ""
    return f"{path}: row {number}{named}"


def _parse_config(text: Any) -> KernelConfig:
    """The KernelConfig in a table's `config` cell. Only that it parses, with each field of its
    type, is checked: configs the current validity rules reject still load (older tables)."""
    if not isinstance(text, str):
        raise ValueError(f"config {_shown(text)} is not JSON text")
    try:
        data = json.loads(text)
    except ValueError as err:
        raise ValueError(f"config is not JSON ({first_line(err)})") from err
    except RecursionError as err:
        raise ValueError("config is not JSON (nested too deeply)") from err
    if not isinstance(data, dict):
        raise ValueError(f"config {_shown(text)} is not a JSON object")
    try:
        cfg = KernelConfig.from_dict(data)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise ValueError(f"config is not a kernel config ({first_line(err)})") from err
    for f in dataclasses.fields(KernelConfig):
        value = getattr(cfg, f.name)
        if type(value) is not type(f.default):
            raise ValueError(f"config is not a kernel config ({f.name} {_shown(value)} is not "
                             f"{'true or false' if isinstance(f.default, bool) else type(f.default).__name__})")
    return cfg


def _check_rows(frame: pd.DataFrame, path: Path) -> list[KernelConfig]:
    """Check every value of a table read from a file; return each row's config.

    Raises:
        BestTableError: one line naming the file, the row (1-based, with its problem) and the
            column of the first bad value.
    """
    configs = [check_row(row, _where(path, number, row.get("problem")))
               for number, row in enumerate(frame.to_dict("records"), 1)]
    seen: dict[tuple[str, str], int] = {}
    for number, key in enumerate(zip(frame["gpu"], frame["problem"]), 1):
        if key in seen:  # a lookup would answer with whichever comes first, whatever its ratio
            raise BestTableError(f"{_where(path, number, key[1])}: a second row for {key[1]} on {key[0]} (the first "
                                 f"is row {seen[key]}): a best-config table holds one row per GPU and problem")
        seen[key] = number
    return configs


def check_row(row: Mapping[Any, Any], where: str) -> KernelConfig:
    """Check one row of a best-config table by the rules a table file's rows pass (each value of
    its column's kind and range, the config, its run-time variant, operation and experts); return
    its config. The rules of every table: `read_table` applies them to a file's rows and
    `load_best` to each row it builds from a store.

    Args:
        row: the row's cells by column; a column of `_CHECKS` it lacks is not checked.
        where: how a message names the row ("PATH: row 3 (PROBLEM)").

    Raises:
        BestTableError: one line, `where` and the column of the first bad value.
    """
    for column, (check, kind) in _CHECKS.items():
        if column in row and not _holds(check, row[column]):
            raise BestTableError(f"{where}: {column} {_shown(row[column])} is not {kind}")
    for dim in ("m", "n", "k"):
        problem = problem_dim_problem(int(_as_number(row[dim])))
        if problem:
            raise BestTableError(f"{where}: {dim} {_shown(row[dim])}: {problem}")
    # The name keys the table (one row per GPU and problem): one that says another shape would
    # hide this row's problem behind another's (a dense "1x1x1_..." loaded).
    shape = "x".join(str(int(_as_number(row[dim]))) for dim in ("m", "n", "k"))
    if "problem" in row and not str(row["problem"]).startswith(f"{shape}_"):
        raise BestTableError(f"{where}: problem {_shown(row['problem'])} is not named by its shape {shape}")
    try:
        cfg = _parse_config(row["config"])
    except ValueError as err:
        raise BestTableError(f"{where}: {err}") from err
    _check_runtime(row, cfg, where)
    _check_operation(row, cfg, where)
    _check_experts(row, where)
    return cfg


def _check_runtime(row: Mapping[Any, Any], cfg: KernelConfig, where: str) -> None:
    """The row's run-time variant passes the rules a space file's does (`check_runtime`: each
    knob's values, Stream-K's arguments on Stream-K kernels only): its values reach the
    kernel's arguments as they are (a swizzle of 2**40 would arrive as 0)."""
    cells_ = {c: row[c] for c in columns(RuntimeArgs)}
    cells_.update({c: int(_as_number(v)) for c, v in cells_.items() if _is_number(_as_number(v))})
    args = RuntimeArgs.from_dict(cells_)  # each cell already of its kind (`_CHECKS`)
    refused = check_runtime(cfg, args)
    if refused:
        shown = ", ".join(f"{c} {_shown(v)}" for c, v in cells_.items())
        raise BestTableError(f"{where}: {refused[0].reason} ({shown}; kernel {cfg.tile_scheduler.value})")


def _check_operation(row: Mapping[Any, Any], cfg: KernelConfig, where: str) -> None:
    """The row's operation is its kernel's: `matmul` picks a row by it and runs its config, so a
    plain kernel under a bias+silu row would return a @ b without the bias."""
    for column, own in cfg.operation.cells().items():
        if row[column] != own:
            raise BestTableError(f"{where}: {column} {_shown(row[column])} is not its config's {own!r}")


_GROUPED_CELLS = (Grouping.GROUPED.value, Grouping.GROUPED_K.value)
"""The `grouping` cells of rows of experts: the forward's and their weight gradients'."""


def _check_experts(row: Mapping[Any, Any], where: str) -> None:
    """A grouped row has experts and a routing, a single GEMM neither: a lookup of a grouped call
    matches the experts exactly."""
    groups = int(_as_number(row["groups"]))
    if row["grouping"] in _GROUPED_CELLS:
        if groups < 1 or row["routing"] == NO_ROUTING:
            raise BestTableError(f"{where}: a grouped row needs groups >= 1 and a routing, not groups {groups} and "
                                 f"routing {_shown(row['routing'])}")
    elif groups != 0 or row["routing"] != NO_ROUTING:
        raise BestTableError(f"{where}: a single GEMM has groups 0 and routing 'none', not groups {groups} and "
                             f"routing {_shown(row['routing'])}")


def _same_knob(got: Any, want: Any) -> bool:
    if isinstance(want, bool):
        got = {"True": True, "False": False}.get(got, got) if isinstance(got, str) else got
        return isinstance(got, (bool, np.bool_)) and got == want
    if isinstance(want, int):
        got = _as_number(got)
        return _is_number(got) and got == want
    return isinstance(got, str) and got == want


def _check_knobs(frame: pd.DataFrame, wanted: list[dict], path: Path) -> None:
    """The knob columns a table has hold its rows' configs' knobs: the kernel is built from
    `config`, and a column that says otherwise would mislead whoever reads the table."""
    have = [c for c in KNOB_COLUMNS if c in frame.columns]
    for number, (row, want) in enumerate(zip(frame[have + ["problem"]].to_dict("records"), wanted), 1):
        for column in have:
            if not _holds(functools.partial(_same_knob, want=want[column]), row[column]):
                raise BestTableError(f"{_where(path, number, row['problem'])}: {column} {_shown(row[column])} "
                                     f"is not its config's {_shown(want[column])}")


def _own_baseline(row: Mapping[Any, Any]) -> str:
    """The baseline a row's `ratio` is to, by its operation's cells (`Baseline.of`)."""
    if row.get("grouping") in _GROUPED_CELLS:
        return Baseline.GROUPED_MM.value
    plain = row.get("epilogue") == Epilogue().name and row.get("scaling") == Scaling.NONE.value
    return (Baseline.CUBLAS if plain else Baseline.EAGER).value


def read_table(path: Path) -> pd.DataFrame:
    """The best-config table in the file `path` (.csv, .json or .parquet), every value checked
    and of its column's kind (the columns of tables/_schema.py).

    Raises:
        BestTableError: no such file, an unknown suffix, a file that cannot be read as a table, a
            missing column, no rows, or a value that is not of its column's kind (naming row and
            column).
    """
    if not path.exists():
        raise BestTableError(f"no best-config table at {path}")
    if path.suffix not in _READERS:
        raise BestTableError(f"{path}: expected a store URL, a .sqlite, .csv, .json or .parquet file, "
                             "or a bundle directory")
    frame = _read_file(path)
    if "ratio" in frame.columns:  # a table written before confirmation existed
        defaults: dict[str, pd.Series | int] = {"sweep_ratio": frame["ratio"], "confirm_passes": 0,
                                                "ratio_low": frame["ratio"], "ratio_high": frame["ratio"]}
        frame = frame.assign(**{c: v for c, v in defaults.items() if c not in frame.columns})
    if "ratio" in frame.columns:  # a table written before the timing method and energy were kept
        frame = frame.assign(**{c: ("" if c == "method" else math.nan) for c in LATER_COLUMNS
                                if c not in frame.columns})
    if "config" in frame.columns:  # a table written before fused epilogues: plain GEMMs, no torch.compile figure
        frame = frame.assign(**{c: "none" for c in OPERATION_COLUMNS if c not in frame.columns},
                             **{c: math.nan for c in COMPILE_COLUMNS if c not in frame.columns})
    if "config" in frame.columns:  # a table written before grouped GEMMs: single GEMMs
        frame = frame if "groups" in frame.columns else frame.assign(groups=0)
        frame = frame if "routing" in frame.columns else frame.assign(routing=NO_ROUTING)
    if "config" in frame.columns and "ratio" in frame.columns:  # written before cuBLASLt and the strongest
        frame = frame.assign(**{c: math.nan for c in CUBLASLT_COLUMNS if c not in frame.columns})
        if "strongest" not in frame.columns and "cublas_tflops" in frame.columns:
            frame = frame.assign(strongest=[_own_baseline(r) for r in frame.to_dict("records")],
                                 strongest_tflops=frame["cublas_tflops"], strongest_ratio=frame["ratio"])
    if "config" in frame.columns and "ratio" in frame.columns:  # written before timing regimes
        frame = frame.assign(**{c: "" for c in REGIME_TEXT_COLUMNS if c not in frame.columns},
                             **{c: math.nan for c in REGIME_NUMBER_COLUMNS if c not in frame.columns})
    if frame.empty and not len(frame.columns):  # `[]`, or a CSV file of blank lines
        raise BestTableError(f"{path} has no rows: a best-config table holds one row per GPU and problem")
    fillable = LATER_KNOBS if "config" in frame.columns else ()
    missing = [c for c in COLUMNS if c not in frame.columns and c not in fillable]
    if missing:
        listed = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise BestTableError(f"{path} is not a best-config table: missing {listed}")
    if frame.empty:
        raise BestTableError(f"{path} has no rows: a best-config table holds one row per GPU and problem")
    configs = _check_rows(frame, path)
    wanted = [cells(c) for c in configs]
    _check_knobs(frame, wanted, path)
    knobs = pd.DataFrame(wanted, index=frame.index)
    # Each column of its kind: knobs from the configs (which they equal; tables written before
    # fp8_fast_accum, epilogue_tile_n and epilogue_source had columns get them here), figures as
    # numbers (a missing one NaN, never None or text).
    return frame.assign(**{c: knobs[c] for c in KNOB_COLUMNS},
                        **{c: pd.to_numeric(frame[c].map(_as_number)).astype("int64") for c in _INTEGERS},
                        **{c: pd.to_numeric(frame[c].map(_as_number)).astype(float) for c in (*_POSITIVE, *_NUMBERS)},
                        method=frame["method"].map(lambda v: "" if _is_missing(v) else v),
                        **{c: frame[c].map(lambda v: "" if _is_missing(v) else v) for c in REGIME_TEXT_COLUMNS})

