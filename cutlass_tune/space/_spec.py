"""Search-space files: YAML that lists problems and the values of each knob.

The format is documented in configs/README.md. Parsing is strict: a file that is not UTF-8
YAML, a key given twice, an unknown key, an empty list, a number written as a string, float or
bool, a value no config could use (tile 100, cluster 3x3, stages 1, an unknown schedule) or a
problem no kernel can run is a `ConfigFileError` naming the file, the key and the value, on one
line. Combinations that are individually fine but do not fit together (cooperative with tile
M 64) are not errors: they are counted as invalid configs with their reason.

`kernels: auto` stands for every config the knobs declare (space/_auto.py); `space_for_shapes`
makes a space of given shapes, with `kernels: auto` or a file's knobs, for `sweep --shapes`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import re
import reprlib
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import pydantic
import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from .._files import InputTooLargeError, read_input
from ..errors import ConfigFileError
from . import _rules
from ._auto import AutoConfigs, AutoKernels, Census
from ._epilogue import Epilogue
from ._kinds import Int, checked
from ._knobs import KernelConfig, Knob, RuntimeArgs
from ._operation import MAX_GROUPS, Operation, Problem
from ._types import DType, Grouping, Layout, Routing, Scaling

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
Size = Annotated[Int, pydantic.AfterValidator(checked(_rules.problem_dim_problem))]

_STRICT = ConfigDict(extra="forbid", strict=False, frozen=True)


class _Dtypes(BaseModel):
    model_config = _STRICT
    input: DType
    output: DType


def _parse_dtypes(v: Any) -> Any:
    return {"input": v, "output": v} if isinstance(v, str) else v


def _parse_epilogue(v: Any) -> Any:
    return Epilogue.parse(v) if isinstance(v, str) else v


EpilogueName = Annotated[Epilogue, BeforeValidator(_parse_epilogue)]
"""An epilogue as `Epilogue.name` writes it: none, bias, bias+silu, residual, ..."""


@dataclasses.dataclass(frozen=True)
class _Route:
    """One `routing:` value of a grouped problem block: how its rows fall over its experts."""

    routing: Routing
    counts: tuple[int, ...] = ()
    """A histogram's rows per expert."""

    @property
    def name(self) -> str:
        return self.routing.value


_ROUTINGS = "uniform, zipf or {histogram: [rows of expert 0, rows of expert 1, ...]}"


def _parse_routing(v: Any) -> _Route:
    if isinstance(v, _Route):
        return v
    if isinstance(v, str) and v in (Routing.UNIFORM.value, Routing.ZIPF.value):
        return _Route(Routing(v))
    if isinstance(v, dict) and list(v) == ["histogram"]:
        counts = v["histogram"]
        if (not isinstance(counts, list) or not counts
                or any(type(c) is not int or c < 0 for c in counts)):
            raise ValueError("a histogram is a list of whole row counts >= 0, one per expert")
        return _Route(Routing.HISTOGRAM, tuple(counts))
    raise ValueError(f"routing must be {_ROUTINGS}")


RouteSpec = Annotated[Any, BeforeValidator(_parse_routing)]
"""A grouped problem's routing: uniform, zipf or {histogram: [...]} (`_Route`)."""


def _experts_problem(v: int) -> str | None:
    if not 1 <= v <= MAX_GROUPS:
        return f"experts must be a whole number from 1 to {MAX_GROUPS}"
    return None


Experts = Annotated[Int, pydantic.AfterValidator(checked(_experts_problem))]


class _Problems(BaseModel):
    """One product of problem sizes; each of m, n, k a number or a list. `epilogue` and
    `scaling`, a value or a list each, take the file's where left out.

    A grouped block (MoE experts, `Grouping.GROUPED`) gives `experts` and `rows` (the routed
    rows of all experts together: the problem's M) in place of m, and `routing` (default the
    file's, else uniform); a histogram's counts give the rows when `rows` is left out.
    `grouping: grouped-k` makes it the experts' weight gradients (`Grouping.GROUPED_K`: dW_e =
    G_e^T X_e, n and k the weight's, layout nt whatever the file's layouts: the math fixes it)."""

    model_config = _STRICT
    m: Many[Size] | None = None
    n: Many[Size]
    k: Many[Size]
    epilogue: Many[EpilogueName] | None = None
    scaling: Many[Scaling] | None = None
    experts: Many[Experts] | None = None
    rows: Many[Size] | None = None
    routing: Many[RouteSpec] | None = None
    grouping: Literal["grouped", "grouped-k"] | None = None

    @model_validator(mode="after")
    def _grouped_or_not(self) -> _Problems:
        if self.experts is None:
            if self.rows is not None or self.routing is not None or self.grouping is not None:
                raise ValueError("rows, routing and grouping belong to a grouped block: give experts too (and "
                                 "no m)")
            if self.m is None:
                raise ValueError("give m, n and k (or experts, rows, n and k for MoE experts)")
        elif self.m is not None:
            raise ValueError("a grouped block gives rows (the routed rows of all experts), not m")
        elif self.rows is None and (self.routing is None or any(
                r.routing is not Routing.HISTOGRAM for r in self.routing)):
            raise ValueError("a grouped block needs rows (the routed rows of all experts) unless its "
                             "every routing is a histogram")
        return self

    def routes(self, spec: _SpaceFile) -> list[_Route]:
        """The block's routings: its own, else the file's, else uniform."""
        return list(self.routing or spec.routing or [_Route(Routing.UNIFORM)])

    def sizes(self, spec: _SpaceFile) -> list[tuple[int, int, int, int, _Route | None]]:
        """(experts or 0, M, N, K, route or None) of each problem of the block: a histogram
        without rows has the sum of its counts as M."""
        if self.experts is None:
            assert self.m is not None  # _grouped_or_not
            return [(0, m, n, k, None) for m, n, k in itertools.product(self.m, self.n, self.k)]
        out: list[tuple[int, int, int, int, _Route | None]] = []
        for e, route, n, k in itertools.product(self.experts, self.routes(spec), self.n, self.k):
            rows = self.rows or [sum(route.counts)]
            out += [(e, m, n, k, route) for m in rows]
        return out


def _knob_model(name: str, knobs: tuple[Knob, ...], doc: str) -> type[BaseModel]:
    """A model with a key per knob: a value or a non-empty list of values, its default alone
    when the key is left out."""
    fields: dict[str, Any] = {
        k.name: (Annotated[list[k.kind.annotation(k.name)], BeforeValidator(k.kind.as_list),  # type: ignore[misc]
                           Field(min_length=1)], [k.default])
        for k in knobs
    }
    return pydantic.create_model(name, __config__=_STRICT, __doc__=doc, **fields)


_Knobs = _knob_model("_Knobs", KernelConfig.knobs, "One product of compile-time knob values; each a value or a list.")
_Runtime = _knob_model("_Runtime", RuntimeArgs.knobs, "The run-time knob values; each a value or a list.")


class _SpaceFile(BaseModel):
    model_config = _STRICT
    description: str = ""
    problems: Many[_Problems]
    dtypes: Many[Annotated[_Dtypes, BeforeValidator(_parse_dtypes)]] = [
        _Dtypes(input=DType.BF16, output=DType.BF16)
    ]
    layouts: Many[Literal["tn", "nt", "nn", "tt"]] = ["tn"]
    epilogue: Many[EpilogueName] = [Epilogue()]
    scaling: Many[Scaling] = [Scaling.NONE]
    routing: Many[RouteSpec] | None = None
    kernels: Many[_Knobs] = [_Knobs()]  # type: ignore[valid-type]
    runtime: _Runtime = _Runtime()  # type: ignore[valid-type]


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """A parsed search-space file: problems, candidate kernel configs and run-time variants."""

    path: str
    description: str
    problems: tuple[Problem, ...]
    candidates: Sequence[KernelConfig]
    """Every distinct config the file describes, valid or not, in file order. With `kernels:
    auto`, the valid configs of each operand kind (`AutoConfigs`), each built when read; the
    invalid ones are counted (`census`), never built."""
    runtime: BaseModel
    """The run-time knobs' values, a list per knob name."""
    auto: tuple[AutoKernels, ...] = ()
    """`kernels: auto`: the configs of each operand kind; empty for a space of knob lists."""

    def classify(self) -> Iterator[tuple[KernelConfig, list[_rules.Rejection]]]:
        """Each candidate with its rejections (empty for a valid config): for `kernels: auto`,
        only valid ones."""
        for cfg in self.candidates:
            yield cfg, [] if self.auto else _rules.check_config(cfg)

    @property
    def valid(self) -> Sequence[KernelConfig]:
        if self.auto:
            return self.candidates
        return tuple(c for c, why in self.classify() if not why)

    def census(self) -> Census:
        """Configs described, valid, and invalid by the first rule that refuses them. For
        `kernels: auto` counted without building them (seconds); for lists, one by one."""
        if self.auto:
            return Census.combined([kind.census() for kind in self.auto])
        invalid: Counter[str] = Counter()
        examples: dict[str, str] = {}
        for _, why in self.classify():
            if why:
                invalid[why[0].rule] += 1
                examples.setdefault(why[0].rule, why[0].reason)
        return Census.of(len(self.candidates), len(self.candidates) - sum(invalid.values()), invalid, examples)

    def holds(self, cfg: KernelConfig) -> bool:
        """Whether `cfg` is one of `candidates` (for `kernels: auto`, a valid config of its
        kind), found without listing them."""
        if self.auto:
            return any(cfg in kind for kind in self.auto)
        return cfg.hash in self._hashes

    def auto_for(self, problem: Problem) -> AutoKernels | None:
        """The `kernels: auto` configs of `problem`'s operation; None for a space of knob lists."""
        operation = problem.operation
        return next((kind for kind in self.auto if kind.operation == operation), None)

    @functools.cached_property
    def _hashes(self) -> frozenset[str]:
        return frozenset(c.hash for c in self.candidates)

    def runtime_variants(self, cfg: KernelConfig) -> tuple[RuntimeArgs, ...]:
        """The run-time variants of the file that apply to `cfg` (a knob that does not apply to
        it, such as splits for a kernel that is not Stream-K, takes its default alone)."""
        knobs = RuntimeArgs.knobs
        # each distinct value once: a list of 10^5 copies is one variant, not 10^5 to sift
        listed = [dict.fromkeys(getattr(self.runtime, k.name)) if k.applies_to(cfg) else [k.default] for k in knobs]
        out: list[RuntimeArgs] = []
        for values in itertools.product(*listed):
            args = RuntimeArgs.from_knobs({k.name: v for k, v in zip(knobs, values)})
            if not _rules.check_runtime(cfg, args) and args not in out:
                out.append(args)
        return tuple(out)


MAX_CANDIDATES = 200_000
"""The most knob combinations a space file may describe (the largest shipped: 13,824)."""
MAX_PROBLEMS = 10_000


def _check_size(path: str, spec: _SpaceFile, auto: bool) -> None:
    """Refuse a space whose products exceed the limits before anything is expanded (a few
    long lists multiply into millions of configs, minutes of work and gigabytes). `kernels:
    auto` is not listed, so its count is no limit."""
    knobs = KernelConfig.knobs
    total = 0
    longest: dict[str, int] = {}
    for listed in [] if auto else spec.kernels:
        lengths = {k.name: len(getattr(listed, k.name)) for k in knobs}
        total += math.prod(lengths.values())
        for name, n in lengths.items():
            longest[name] = max(longest.get(name, 0), n)
    total *= len(spec.dtypes) * len(spec.layouts) * max(len(_operations(b, spec)) for b in spec.problems)
    if total > MAX_CANDIDATES:
        widest = sorted(longest.items(), key=lambda item: -item[1])[:2]
        raise ConfigFileError(path, "kernels", None, f"{total:,} knob combinations, more than the {MAX_CANDIDATES:,} "
                              f"a space may hold (longest lists: {', '.join(f'{k} {n}' for k, n in widest)})")
    problems = sum(_block_size(b, spec) * len(_operations(b, spec)) for b in spec.problems) * len(spec.dtypes) * len(
        spec.layouts)
    if problems > MAX_PROBLEMS:
        raise ConfigFileError(path, "problems", None, f"{problems:,} problems, more than the {MAX_PROBLEMS:,} a "
                              "space may hold")


def _block_size(block: _Problems, spec: _SpaceFile) -> int:
    """How many shapes a problem block multiplies out to, without listing them."""
    if block.experts is None:
        return len(block.m or ()) * len(block.n) * len(block.k)
    return len(block.experts) * len(block.routes(spec)) * len(block.rows or [0]) * len(block.n) * len(block.k)


def _operations(block: _Problems, spec: _SpaceFile) -> list[tuple[Epilogue, Scaling]]:
    """The (epilogue, scaling) pairs of a problem block: its own, else the file's."""
    return list(itertools.product(block.epilogue or spec.epilogue, block.scaling or spec.scaling))


def _operations_of(problems: Sequence[Problem]) -> list[Operation]:
    """The distinct operations of `problems`, in their order."""
    return list(dict.fromkeys(p.operation for p in problems))


def _expand_configs(spec: _SpaceFile, problems: Sequence[Problem]) -> list[KernelConfig]:
    knobs = KernelConfig.knobs
    seen: dict[str, KernelConfig] = {}
    for operation, listed in itertools.product(_operations_of(problems), spec.kernels):
        for values in itertools.product(*(getattr(listed, k.name) for k in knobs)):
            cfg = KernelConfig.from_knobs({k.name: v for k, v in zip(knobs, values)}, operation)
            seen.setdefault(cfg.hash, cfg)
    return list(seen.values())


def _expand_problems(path: str, spec: _SpaceFile) -> list[Problem]:
    out: dict[Problem, None] = {}  # in file order, each once
    for block, dtypes, layout in itertools.product(spec.problems, spec.dtypes, spec.layouts):
        grouping = Grouping(block.grouping or Grouping.GROUPED.value)
        layout_a, layout_b = _LAYOUT_CODES["nt" if grouping is Grouping.GROUPED_K else layout]
        for (experts, m, n, k, route), (epilogue, scaling) in itertools.product(
                block.sizes(spec), _operations(block, spec)):
            grouped: dict[str, Any] = {} if route is None else {
                "grouping": grouping, "groups": experts, "routing": route.routing,
                "group_rows": route.counts}
            p = Problem(m, n, k, dtype_a=dtypes.input, dtype_b=dtypes.input, dtype_d=dtypes.output,
                        layout_a=layout_a, layout_b=layout_b, epilogue=epilogue, scaling=scaling, **grouped)
            why = _rules.check_problem(p)
            if why:
                operation = (f" {epilogue.name}" if not epilogue.is_plain else "") + (
                    f" scaling {scaling.value}" if scaling is not Scaling.NONE else "")
                shape = f"{m}x{n}x{k}" if route is None else f"{_PREFIX[grouping]}{experts}:{m}x{n}x{k} {route.name}"
                raise ConfigFileError(path, "problems", f"{shape} {layout}{operation}", str(why[0]))
            out.setdefault(p)
    return list(out)


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
        data = read_input(path, MAX_SPACE_BYTES)
    except InputTooLargeError as err:
        raise ConfigFileError(path, "", None, f"more than {MAX_SPACE_BYTES >> 20} MiB: not a space file") from err
    except OSError as err:
        raise ConfigFileError(path, "", None, f"cannot read: {err.strerror}") from err
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ConfigFileError(path, f"line {line}", None,
                              f"not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})") from err


MAX_SPACE_BYTES = 1 << 20
"""The most a space file may hold (the largest committed holds 2 KB): its YAML is read whole, each
MB taking about 15 s with PyYAML's own parser, a second with libyaml's."""
_LOADER: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's loader where PyYAML was built with it."""
_RETOLD_BYTES = 64 << 10
"""A file up to this size whose YAML libyaml refused is parsed again by PyYAML's own parser, whose
messages name the character at fault (libyaml's say "found character that cannot start any token")."""


def _parse_yaml(path: str, text: str) -> Any:
    """The one YAML document in `text`, its keys checked for duplicates."""
    try:
        return _load_yaml(path, text, _LOADER)
    except ConfigFileError:
        if _LOADER is yaml.SafeLoader or len(text) > _RETOLD_BYTES:
            raise
    return _load_yaml(path, text, yaml.SafeLoader)


def _load_yaml(path: str, text: str, loader_class: type[yaml.SafeLoader] | type[yaml.CSafeLoader]) -> Any:
    try:
        loader = loader_class(text)
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
    return _space(path, _read_mapping(path))


def _read_mapping(path: str) -> dict:
    raw = _parse_yaml(path, _read_text(path))
    if not isinstance(raw, dict):
        raise ConfigFileError(path, "", None, "expected a mapping at the top level")
    return raw


@functools.lru_cache(maxsize=16)
def _auto_kernels(operation: Operation) -> AutoKernels:
    """One `AutoKernels` per operation and process: its walk is kept (seconds each)."""
    return AutoKernels(operation)


def _space(path: str, raw: dict) -> SearchSpace:
    auto = raw.get("kernels") == "auto"
    try:
        spec = _SpaceFile.model_validate({k: v for k, v in raw.items() if not (auto and k == "kernels")})
    except pydantic.ValidationError as err:
        raise _validation_error(path, err) from err
    _check_size(path, spec, auto)
    if spec.routing is not None and all(b.experts is None for b in spec.problems):
        raise ConfigFileError(path, "routing", None, "goes with grouped problem blocks (experts, rows, n, k)")
    problems = tuple(_expand_problems(path, spec))
    if not auto:
        return SearchSpace(path=path, description=spec.description, problems=problems,
                           candidates=tuple(_expand_configs(spec, problems)), runtime=spec.runtime)
    kinds = tuple(_auto_kernels(operation) for operation in _operations_of(problems))
    return SearchSpace(path=path, description=spec.description, problems=problems, candidates=AutoConfigs(kinds),
                       runtime=spec.runtime, auto=kinds)


SHAPES_RUNTIME = {"raster": ["along_m", "along_n"], "swizzle": [1, 4, 8],
                  "decomposition": ["heuristic", "data_parallel", "stream_k"]}
"""The run-time variants of a space of `--shapes` alone: those of configs/sm90_bf16.yaml (six per
kernel, eighteen per Stream-K kernel)."""
_SHAPE = re.compile(r"\s*(?:(?P<prefix>[eE]|[dD][wW])(?P<experts>\d+)\s*:\s*)?(?P<m>\d+)\s*[xX]\s*(?P<n>\d+)\s*[xX]\s*"
                    r"(?P<k>\d+)\s*", re.ASCII)
"""MxNxK, or EXPERTS:ROWSxNxK for a grouped problem (`e128:32768x1536x2048`: 128 experts, 32768
routed rows, N 1536, K 2048), or dwEXPERTS:ROWSxNxK for their weight gradients (`dw128:32768x1536x2048`:
dW_e = G_e^T X_e of E x 1536 x 2048, G 32768 x 1536, X 32768 x 2048)."""
_PREFIX = {Grouping.GROUPED: "e", Grouping.GROUPED_K: "dw"}
"""A grouped shape's prefix in `--shapes`, by grouping."""


def space_for_shapes(shapes: str, *, dtype: str | None = None, layout: str | None = None,
                     config: str | Path | None = None, epilogue: str | None = None,
                     scaling: str | None = None, routing: str | None = None) -> SearchSpace:
    """The space of `sweep --shapes`: the problems `shapes` lists (MxNxK, comma-separated; MoE
    experts as eE:ROWSxNxK, their weight gradients as dwE:ROWSxNxK (layout nt always), each with
    every routing of `routing`, uniform and/or zipf, comma-separated, default uniform), each
    of type `dtype` (IN or IN:OUT; fp8 gives bf16 out unless told) and `layout` (tn, nt, nn,
    tt), computing `epilogue` (an `Epilogue.name`: bias+silu, ...) with fp8 `scaling` (none,
    tensor, rowcol, blockwise); with `config`, that file's knobs and run-time variants, its types,
    layouts, epilogue and scaling where not given; without, `kernels: auto` and
    `SHAPES_RUNTIME`, bf16, tn and the plain GEMM where not given.

    Raises:
        ConfigFileError: a shape, type, layout, epilogue, scaling or routing that is malformed, or
            that no kernel can run; or a bad `config`. One line.
    """
    problems: list[dict[str, Any]] = []
    routes = None if routing is None else [r.strip() for r in routing.split(",")]
    for item in shapes.split(","):
        match = _SHAPE.fullmatch(item)
        if not match:
            raise ConfigFileError("--shapes", "", _shown(item.strip()), "give each shape as MxNxK, e.g. "
                                  "4096x4096x4096, or MoE experts as eE:ROWSxNxK, e.g. e128:32768x1536x2048 "
                                  "(dwE:ROWSxNxK for their weight gradients)")
        size = {"n": int(match["n"]), "k": int(match["k"])}
        if match["experts"] is None:
            problems.append({"m": int(match["m"]), **size})
        else:
            grouping = Grouping.GROUPED_K if match["prefix"].lower() == "dw" else Grouping.GROUPED
            problems.append({"experts": int(match["experts"]), "rows": int(match["m"]), **size,
                             **({"routing": routes} if routes else {}), "grouping": grouping.value})
    if routes is not None:
        bad = next((r for r in routes if r not in (Routing.UNIFORM.value, Routing.ZIPF.value)), None)
        if bad is not None:
            raise ConfigFileError("--routing", "", _shown(bad), "give uniform or zipf (or both: uniform,zipf)")
        if not any("experts" in p for p in problems):
            raise ConfigFileError("--routing", "", None, "goes with MoE shapes in --shapes (eE:ROWSxNxK)")
    raw: dict[str, Any] = ({"kernels": "auto", "runtime": SHAPES_RUNTIME, "dtypes": ["bf16"], "layouts": ["tn"]}
                           if config is None else _read_mapping(str(config)))
    raw = {**raw, "problems": problems}
    raw["description"] = ", ".join(d for d in (str(raw.get("description") or ""), f"on --shapes {shapes}") if d)
    if dtype is not None:
        given, _, out = dtype.partition(":")
        raw["dtypes"] = [{"input": given, "output": out or ("bf16" if given in ("e4m3", "e5m2") else given)}]
    if layout is not None:
        raw["layouts"] = [layout]
    for key, value in (("epilogue", epilogue), ("scaling", scaling)):
        if value is not None:
            raw[key] = value
    label = "--shapes" if config is None else f"{config} --shapes"
    return _space(label, raw)


def sweep_space(config: str | Path | None, shapes: str | None = None, dtype: str | None = None,
                layout: str | None = None, epilogue: str | None = None, scaling: str | None = None,
                routing: str | None = None) -> SearchSpace:
    """The space `sweep` tunes: the file `config`; with `shapes`, those shapes over the file's
    knobs, or over `kernels: auto` without a file (`space_for_shapes`).

    Raises:
        ConfigFileError: neither a file nor shapes, a type, layout, epilogue or scaling without
            shapes, or what `load_space` and `space_for_shapes` raise. One line.
    """
    if shapes is not None:
        return space_for_shapes(shapes, dtype=dtype, layout=layout, config=config, epilogue=epilogue,
                                scaling=scaling, routing=routing)
    if dtype is not None or layout is not None:
        raise ConfigFileError("--dtype" if dtype is not None else "--layout", "", None,
                              "goes with --shapes (a space file gives its own types and layouts)")
    if epilogue is not None or scaling is not None:
        raise ConfigFileError("--epilogue" if epilogue is not None else "--scaling", "", None,
                              "goes with --shapes (a space file gives its own epilogue and scaling)")
    if routing is not None:
        raise ConfigFileError("--routing", "", None, "goes with MoE shapes in --shapes (a space file gives "
                              "its own routing)")
    if config is None:
        raise ConfigFileError("sweep", "", None, "give a search-space file or --shapes MxNxK[,MxNxK...]")
    return load_space(config)
