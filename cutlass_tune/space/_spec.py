"""Search-space files: YAML that lists problems and the values of each knob.

The format is documented in configs/README.md. Parsing is strict: an unknown key, a value no
config could use (tile 100, cluster 3x3, stages 1, an unknown schedule) or a problem no kernel
can run is a `ConfigFileError` naming the file, the key and the value. Combinations that are
individually fine but do not fit together (cooperative with tile M 64) are not errors: they
are counted as invalid configs with their reason.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Literal, Union

import pydantic
import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

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


def _as_list(v: Any) -> Any:
    return v if isinstance(v, list) else [v]


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


def _parse_cluster(v: Any) -> Any:
    if isinstance(v, str) and "x" in v:
        parts = v.lower().split("x")
        if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
            v = [int(p) for p in parts]
    if not (isinstance(v, list) and len(v) == 2):
        raise ValueError("cluster must be written MxN (e.g. 2x1) or [M, N]")
    for dim in v:
        problem = _rules.cluster_dim_problem(dim)
        if problem:
            raise ValueError(problem)
    if v[0] * v[1] > _rules.MAX_CLUSTER_CTAS:
        raise ValueError(f"a cluster holds at most {_rules.MAX_CLUSTER_CTAS} CTAs")
    return (v[0], v[1])


TileM = Annotated[int, pydantic.AfterValidator(_checked(_rules.tile_m_problem))]
TileN = Annotated[int, pydantic.AfterValidator(_checked(_rules.tile_n_problem))]
TileK = Annotated[int, pydantic.AfterValidator(_checked(_rules.tile_k_problem))]
Stages = Annotated[int, BeforeValidator(_parse_stages), pydantic.AfterValidator(_checked(_rules.stages_problem))]
Cluster = Annotated[tuple[int, int], BeforeValidator(_parse_cluster)]
Swizzle = Annotated[int, pydantic.AfterValidator(_checked(_rules.swizzle_problem))]
Splits = Annotated[int, pydantic.AfterValidator(_checked(_rules.splits_problem))]
FastAccum = Annotated[bool, BeforeValidator(_checked(_rules.fp8_fast_accum_problem))]
EpilogueTileN = Annotated[int, BeforeValidator(_parse_epilogue_tile),
                          pydantic.AfterValidator(_checked(_rules.epilogue_tile_n_problem))]
EpilogueSource = Annotated[bool, BeforeValidator(_checked(_rules.epilogue_source_problem))]
Listed = BeforeValidator(_as_list)
Positive = Annotated[int, Field(gt=0)]

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
    m: Annotated[list[Positive], Listed]
    n: Annotated[list[Positive], Listed]
    k: Annotated[list[Positive], Listed]


class _Knobs(BaseModel):
    """One product of compile-time knob values; each a value or a list."""

    model_config = _STRICT
    tile_m: Annotated[list[TileM], Listed] = [128]
    tile_n: Annotated[list[TileN], Listed] = [128]
    tile_k: Annotated[list[TileK], Listed] = [64]
    cluster: Annotated[list[Cluster], Listed] = [(1, 1)]
    stages: Annotated[list[Stages], Listed] = [AUTO_STAGES]
    kernel_schedule: Annotated[list[KernelSchedule], Listed] = [KernelSchedule.COOPERATIVE]
    epilogue_schedule: Annotated[list[Union[Literal["auto"], EpilogueSchedule]], Listed] = ["auto"]
    tile_scheduler: Annotated[list[TileScheduler], Listed] = [TileScheduler.PERSISTENT]
    fp8_fast_accum: Annotated[list[FastAccum], Listed] = [False]
    epilogue_tile_n: Annotated[list[EpilogueTileN], Listed] = [AUTO_EPILOGUE_TILE]
    epilogue_source: Annotated[list[EpilogueSource], Listed] = [True]

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
    raster: Annotated[list[Annotated[RasterOrder, BeforeValidator(_parse_raster)]], Listed] = [
        RasterOrder.HEURISTIC
    ]
    swizzle: Annotated[list[Swizzle], Listed] = [1]
    splits: Annotated[list[Splits], Listed] = [1]
    decomposition: Annotated[
        list[Annotated[Decomposition, BeforeValidator(_parse_decomposition)]], Listed
    ] = [Decomposition.HEURISTIC]


class _SpaceFile(BaseModel):
    model_config = _STRICT
    description: str = ""
    problems: Annotated[list[_Problems], Listed]
    dtypes: Annotated[list[Annotated[_Dtypes, BeforeValidator(_parse_dtypes)]], Listed] = [
        _Dtypes(input=DType.BF16, output=DType.BF16)
    ]
    layouts: Annotated[list[Literal["tn", "nt", "nn", "tt"]], Listed] = ["tn"]
    kernels: Annotated[list[_Knobs], Listed] = [_Knobs()]
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


def _location(loc: tuple) -> str:
    # pydantic puts validator names (function-after[...]) into the location; keep field names
    # and list indices only.
    parts = [str(p) for p in loc if isinstance(p, int) or not any(c in str(p) for c in "[(")]
    return ".".join(parts)


def load_space(path: str | Path) -> SearchSpace:
    """Parse and validate a search-space file.

    Raises:
        ConfigFileError: unreadable file, malformed YAML, unknown key or value, bad problem.
    """
    path = str(path)
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigFileError(path, "", None, f"cannot read: {err.strerror}") from err
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "?"
        raise ConfigFileError(path, where, None, f"malformed YAML: {getattr(err, 'problem', err)}") from err
    if not isinstance(raw, dict):
        raise ConfigFileError(path, "", None, "expected a mapping at the top level")
    try:
        spec = _SpaceFile.model_validate(raw)
    except pydantic.ValidationError as err:
        first = err.errors()[0]
        key = _location(first["loc"])
        problem = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            problem = "unknown key"
        raise ConfigFileError(path, key, first.get("input"), problem) from err
    return SearchSpace(
        path=path,
        description=spec.description,
        problems=tuple(_expand_problems(path, spec)),
        candidates=tuple(_expand_configs(spec)),
        runtime=spec.runtime,
    )
