"""Search-space files: YAML that lists problems and the values of each knob.

The format is documented in configs/README.md. Parsing is strict: a file that is not UTF-8
YAML, a key given twice, an unknown key, an empty list, a number written as a string, float or
bool, a value no config could use (tile 100, cluster 3x3, stages 1, an unknown schedule) or a
problem no kernel can run is a `ConfigFileError` naming the file, the key and the value, on one
line. Combinations that are individually fine but do not fit together (cooperative with tile
M 64) are not errors: they are counted as invalid configs with their reason.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import reprlib
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Literal, TypeVar, Union

import pydantic
import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, field_validator

from ..errors import ConfigFileError
from . import _rules
from ._types import (
    AUTO_EPILOGUE_TILE,
    AUTO_STAGES,
    Decomposition,
    DType,
    EpilogueSchedule,
    KernelConfig,
    KernelSchedule,
    Layout,
    Problem,
    RasterOrder,
    RuntimeArgs,
    TileScheduler,
)

_EPILOGUE_AUTO = {
    KernelSchedule.COOPERATIVE: EpilogueSchedule.TMA_COOPERATIVE,
    KernelSchedule.PINGPONG: EpilogueSchedule.TMA,
    KernelSchedule.TMA_WS: EpilogueSchedule.TMA,
}
_LAYOUT_CODES = {
    "tn": (Layout.ROW, Layout.COL),
    "nt": (Layout.COL, Layout.ROW),
    "nn": (Layout.COL, Layout.COL),
    "tt": (Layout.ROW, Layout.ROW),
}


_ECHO_CHARS = 120
"""The most characters of a key or value an error line echoes."""
_MAX_ERROR_CHARS = 200
"""The most characters of a reason an error line gives (PyYAML's may quote the file)."""

_T = TypeVar("_T")


def _as_list(v: Any) -> Any:
    return v if isinstance(v, list) else [v]


Many = Annotated[list[_T], BeforeValidator(_as_list), Field(min_length=1)]
"""A value or a non-empty list of values."""
Int = Annotated[int, Strict()]
"""An integer written as one: not a string, float or bool."""


def _checked(rule):
    def check(v: Any) -> Any:
        problem = rule(v)
        if problem:
            raise ValueError(problem)
        return v
    return check


def _auto_or_number(auto: int, message: str) -> Callable[[Any], Any]:
    """A parser for knobs written `auto` or a number: `auto` becomes the `auto` sentinel; the
    sentinel itself, a bool or a non-integer is refused with `message`."""
    def parse(v: Any) -> Any:
        if v == "auto":
            return auto
        if v == auto or not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(message)
        return v
    return parse


_parse_stages = _auto_or_number(AUTO_STAGES, "stages must be auto or a number from 2 to 16")
_parse_epilogue_tile = _auto_or_number(
    AUTO_EPILOGUE_TILE, "epilogue_tile_n must be auto or a multiple of 16 between 16 and 256")


_CLUSTER = re.compile(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", re.ASCII)


def _parse_cluster(v: Any) -> Any:
    if isinstance(v, str) and (match := _CLUSTER.fullmatch(v)):
        v = [int(match[1]), int(match[2])]
    if not (isinstance(v, list) and len(v) == 2):
        raise ValueError("cluster must be written MxN (e.g. 2x1) or [M, N]")
    for dim in v:
        problem = _rules.cluster_dim_problem(dim)
        if problem:
            raise ValueError(problem)
    if v[0] * v[1] > _rules.MAX_CLUSTER_CTAS:
        raise ValueError(f"a cluster holds at most {_rules.MAX_CLUSTER_CTAS} CTAs")
    return (v[0], v[1])


def _parse_epilogue_schedule(v: Any) -> Any:
    names = ["auto", *(e.value for e in EpilogueSchedule)]
    if isinstance(v, str) and v in names:
        return v if v == "auto" else EpilogueSchedule(v)
    raise ValueError(f"epilogue_schedule must be {', '.join(names[:-1])} or {names[-1]}")


TileM = Annotated[Int, pydantic.AfterValidator(_checked(_rules.tile_m_problem))]
TileN = Annotated[Int, pydantic.AfterValidator(_checked(_rules.tile_n_problem))]
TileK = Annotated[Int, pydantic.AfterValidator(_checked(_rules.tile_k_problem))]
Stages = Annotated[Int, BeforeValidator(_parse_stages), pydantic.AfterValidator(_checked(_rules.stages_problem))]
Cluster = Annotated[tuple[Int, Int], BeforeValidator(_parse_cluster)]
Swizzle = Annotated[Int, pydantic.AfterValidator(_checked(_rules.swizzle_problem))]
Splits = Annotated[Int, pydantic.AfterValidator(_checked(_rules.splits_problem))]
FastAccum = Annotated[bool, BeforeValidator(_checked(_rules.fp8_fast_accum_problem))]
EpilogueTileN = Annotated[Int, BeforeValidator(_parse_epilogue_tile),
                          pydantic.AfterValidator(_checked(_rules.epilogue_tile_n_problem))]
EpilogueSource = Annotated[bool, BeforeValidator(_checked(_rules.epilogue_source_problem))]
EpilogueChoice = Annotated[Union[Literal["auto"], EpilogueSchedule],
                           BeforeValidator(_parse_epilogue_schedule)]
Size = Annotated[Int, pydantic.AfterValidator(_checked(_rules.problem_dim_problem))]

_STRICT = ConfigDict(extra="forbid", strict=False, frozen=True)


class _Dtypes(BaseModel):
    model_config = _STRICT
    input: DType
    output: DType


def _parse_dtypes(v: Any) -> Any:
    return {"input": v, "output": v} if isinstance(v, str) else v


class _Problems(BaseModel):
    """One product of problem sizes; each of m, n, k a number or a list."""

    model_config = _STRICT
    m: Many[Size]
    n: Many[Size]
    k: Many[Size]


class _Knobs(BaseModel):
    """One product of compile-time knob values; each a value or a list."""

    model_config = _STRICT
    tile_m: Many[TileM] = [128]
    tile_n: Many[TileN] = [128]
    tile_k: Many[TileK] = [64]
    cluster: Many[Cluster] = [(1, 1)]
    stages: Many[Stages] = [AUTO_STAGES]
    kernel_schedule: Many[KernelSchedule] = [KernelSchedule.COOPERATIVE]
    epilogue_schedule: Many[EpilogueChoice] = ["auto"]
    tile_scheduler: Many[TileScheduler] = [TileScheduler.PERSISTENT]
    fp8_fast_accum: Many[FastAccum] = [False]
    epilogue_tile_n: Many[EpilogueTileN] = [AUTO_EPILOGUE_TILE]
    epilogue_source: Many[EpilogueSource] = [True]

    @field_validator("cluster", mode="before")
    @classmethod
    def _cluster_pair_is_one_value(cls, v: Any) -> Any:
        # [2, 1] is one cluster, not a list of two.
        if isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v):
            return [v]
        return v


def _parse_raster(v: Any) -> Any:
    if isinstance(v, str) and v.upper() in RasterOrder.__members__:
        return RasterOrder[v.upper()]
    raise ValueError("raster must be heuristic, along_m or along_n")


def _parse_decomposition(v: Any) -> Any:
    if isinstance(v, str) and v.upper() in Decomposition.__members__:
        return Decomposition[v.upper()]
    raise ValueError("decomposition must be heuristic, data_parallel, split_k or stream_k")


class _Runtime(BaseModel):
    model_config = _STRICT
    raster: Many[Annotated[RasterOrder, BeforeValidator(_parse_raster)]] = [RasterOrder.HEURISTIC]
    swizzle: Many[Swizzle] = [1]
    splits: Many[Splits] = [1]
    decomposition: Many[Annotated[Decomposition, BeforeValidator(_parse_decomposition)]] = [
        Decomposition.HEURISTIC
    ]


class _SpaceFile(BaseModel):
    model_config = _STRICT
    description: str = ""
    problems: Many[_Problems]
    dtypes: Many[Annotated[_Dtypes, BeforeValidator(_parse_dtypes)]] = [
        _Dtypes(input=DType.BF16, output=DType.BF16)
    ]
    layouts: Many[Literal["tn", "nt", "nn", "tt"]] = ["tn"]
    kernels: Many[_Knobs] = [_Knobs()]
    runtime: _Runtime = _Runtime()


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """A parsed search-space file: problems, candidate kernel configs and run-time variants."""

    path: str
    description: str
    problems: tuple[Problem, ...]
    candidates: tuple[KernelConfig, ...]
    """Every distinct config the file describes, valid or not, in file order."""
    runtime: _Runtime

    def classify(self) -> Iterator[tuple[KernelConfig, list[_rules.Rejection]]]:
        """Each candidate with its rejections (empty for a valid config)."""
        for cfg in self.candidates:
            yield cfg, _rules.check_config(cfg)

    @property
    def valid(self) -> tuple[KernelConfig, ...]:
        return tuple(c for c, why in self.classify() if not why)

    def runtime_variants(self, cfg: KernelConfig) -> tuple[RuntimeArgs, ...]:
        """The run-time variants of the file that apply to `cfg` (splits and decomposition
        only to Stream-K kernels)."""
        stream_k = cfg.tile_scheduler is TileScheduler.STREAM_K
        splits = self.runtime.splits if stream_k else [1]
        modes = self.runtime.decomposition if stream_k else [Decomposition.HEURISTIC]
        out = []
        for raster, swizzle, sp, mode in itertools.product(
            self.runtime.raster, self.runtime.swizzle, splits, modes
        ):
            args = RuntimeArgs(raster=raster, swizzle=swizzle, splits=sp, decomposition=mode)
            if not _rules.check_runtime(cfg, args) and args not in out:
                out.append(args)
        return tuple(out)


def _expand_configs(spec: _SpaceFile) -> list[KernelConfig]:
    seen: dict[str, KernelConfig] = {}
    for dtypes, layout, knobs in itertools.product(spec.dtypes, spec.layouts, spec.kernels):
        layout_a, layout_b = _LAYOUT_CODES[layout]
        for tm, tn, tk, (cm, cn), st, ks, es, ts, fast, epi_n, source in itertools.product(
            knobs.tile_m, knobs.tile_n, knobs.tile_k, knobs.cluster, knobs.stages,
            knobs.kernel_schedule, knobs.epilogue_schedule, knobs.tile_scheduler,
            knobs.fp8_fast_accum, knobs.epilogue_tile_n, knobs.epilogue_source,
        ):
            cfg = KernelConfig(
                dtype_a=dtypes.input, dtype_b=dtypes.input, dtype_c=dtypes.output,
                dtype_d=dtypes.output, layout_a=layout_a, layout_b=layout_b,
                tile_m=tm, tile_n=tn, tile_k=tk, cluster_m=cm, cluster_n=cn, stages=st,
                kernel_schedule=ks,
                epilogue_schedule=_EPILOGUE_AUTO[ks] if es == "auto" else es,
                tile_scheduler=ts, fp8_fast_accum=fast, epilogue_tile_n=epi_n,
                epilogue_source=source,
            )
            seen.setdefault(cfg.hash, cfg)
    return list(seen.values())


def _expand_problems(path: str, spec: _SpaceFile) -> list[Problem]:
    out: list[Problem] = []
    for i, (block, dtypes, layout) in enumerate(
        itertools.product(spec.problems, spec.dtypes, spec.layouts)
    ):
        layout_a, layout_b = _LAYOUT_CODES[layout]
        for m, n, k in itertools.product(block.m, block.n, block.k):
            p = Problem(m, n, k, dtypes.input, dtypes.input, dtypes.output, layout_a, layout_b)
            why = _rules.check_problem(p)
            if why:
                raise ConfigFileError(path, "problems", f"{m}x{n}x{k} {layout}", str(why[0]))
            if p not in out:
                out.append(p)
    return out


class _Shown(str):
    """A value as an error line echoes it when its repr would be long: the repr, cut short."""

    def __repr__(self) -> str:
        return str(self)


_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = 10
_REPR.maxstring = _REPR.maxlong = _REPR.maxother = _ECHO_CHARS


def _clip(text: str, limit: int = _ECHO_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _escaped(text: str) -> str:
    """`text` with line breaks and other unprintable characters escaped, cut short."""
    return _clip(repr(text[: _ECHO_CHARS + 1])[1:-1])


def _prose(text: str) -> str:
    """A reason on one line: runs of white space, line breaks included, become one space."""
    return _clip(" ".join(text.split()), _MAX_ERROR_CHARS)


def _shown(value: Any) -> Any:
    """`value` itself where its repr is short (a str's repr escapes its line breaks), else its
    repr cut short, without walking more than a bounded part of a large or nested value."""
    text = _REPR.repr(value)
    if value is not None and len(text) <= _ECHO_CHARS and "..." not in text:
        return value
    return _Shown(_clip(text))


def _location(loc: tuple) -> str:
    # No union in the models fails (epilogue_schedule's is parsed before it), so pydantic puts
    # no member names into the location: every part is a field name, an index or a file's key.
    return _clip(".".join(_escaped(str(p)) for p in loc))


def _place(line: int, column: int) -> str:
    return f"line {line + 1}, column {column + 1}"


def _yaml_error(path: str, text: str, err: yaml.YAMLError) -> ConfigFileError:
    """`err` on one line: the line and column, and the problem without PyYAML's excerpt of the
    file."""
    where, what = "", str(err)
    if isinstance(err, yaml.MarkedYAMLError):
        mark = err.problem_mark or err.context_mark
        where = _place(mark.line, mark.column) if mark is not None else ""
        what = ", ".join(p for p in (err.context, err.problem) if p) or what
    elif isinstance(err, yaml.reader.ReaderError):
        line_start = text.rfind("\n", 0, err.position) + 1
        where = _place(text.count("\n", 0, err.position), err.position - line_start)
        what = what.splitlines()[0]
    return ConfigFileError(path, where, None, f"malformed YAML: {_prose(what)}")


def _reject_duplicate_keys(path: str, node: yaml.Node | None, where: str = "",
                           seen: set[int] | None = None) -> None:
    """Raise ConfigFileError for a mapping that gives a key twice (PyYAML would keep the last).
    A key brought in by a merge (`<<: *anchor`) may still be given."""
    seen = set() if seen is None else seen
    if node is None or id(node) in seen:
        return
    seen.add(id(node))
    children: list[tuple[str, yaml.Node]] = []
    if isinstance(node, yaml.SequenceNode):
        children = [(str(i), item) for i, item in enumerate(node.value)]
    elif isinstance(node, yaml.MappingNode):
        first: dict[tuple[str, str], str] = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                children.append(("?", value))
                continue
            here = _place(key.start_mark.line, key.start_mark.column)
            if (key.tag, key.value) in first:
                at = f"{where}.{key.value}" if where else key.value
                raise ConfigFileError(path, _escaped(at), None, f"duplicate key (at {here}; first "
                                      f"given at {first[key.tag, key.value]})")
            first[key.tag, key.value] = here
            children.append((key.value, value))
    for name, child in children:
        _reject_duplicate_keys(path, child, f"{where}.{name}" if where else name, seen)


def _read_text(path: str) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise ConfigFileError(path, "", None, f"cannot read: {err.strerror}") from err
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ConfigFileError(path, f"line {line}", None,
                              f"not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})") from err


def _parse_yaml(path: str, text: str) -> Any:
    """The one YAML document in `text`, its keys checked for duplicates."""
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            _reject_duplicate_keys(path, node)
            return loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        raise _yaml_error(path, text, err) from err
    except RecursionError as err:
        raise ConfigFileError(path, "", None, "malformed YAML: nested too deeply") from err
    except ValueError as err:  # a number with too many digits, a date such as 2024-13-01
        raise ConfigFileError(path, "", None,
                              f"malformed YAML: cannot read a value ({_prose(str(err))})") from err


def _validation_error(path: str, err: pydantic.ValidationError) -> ConfigFileError:
    """The first of pydantic's errors as the file's key, the value there and the problem."""
    first = err.errors()[0]
    key = _location(first["loc"])
    value = _shown(first.get("input"))
    problem = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        problem = "unknown key"
    elif first["type"] == "missing":
        value, problem = None, "required key missing"
    elif first["type"] == "too_short":
        problem = "must not be empty"
    elif first["type"] == "int_type":
        problem = "must be a plain integer (not a string, float or bool)"
    return ConfigFileError(path, key, value, _prose(problem))


def load_space(path: str | Path) -> SearchSpace:
    """Parse and validate a search-space file.

    Raises:
        ConfigFileError: unreadable file, not UTF-8, malformed YAML, duplicate or unknown key,
            bad value, bad problem; its message is one line.
    """
    path = str(path)
    raw = _parse_yaml(path, _read_text(path))
    if not isinstance(raw, dict):
        raise ConfigFileError(path, "", None, "expected a mapping at the top level")
    try:
        spec = _SpaceFile.model_validate(raw)
    except pydantic.ValidationError as err:
        raise _validation_error(path, err) from err
    return SearchSpace(
        path=path,
        description=spec.description,
        problems=tuple(_expand_problems(path, spec)),
        candidates=tuple(_expand_configs(spec)),
        runtime=spec.runtime,
    )
