"""Every knob the tuner chooses, declared once, and the objects that carry their values.

Compile-time knobs are fields of `KernelConfig` (each value makes a new binary); run-time knobs
are fields of `RuntimeArgs` (set per launch on an existing binary). Keeping them apart is what
lets one compile serve many measurements.

Each class's `knobs` declares every spelling of its knobs that a stage needs:

- in a space file: the key (`Knob.name`), how one value is written and parsed (`Knob.kind`,
  one of space/_kinds.py), with its per-value rule from space/_rules.py, and the default (the
  fields' default);
- in `kernels: auto` (space/_auto.py): every value it tries (`auto_values`);
- in an Optuna study: the same name, one string per value (`Kind.text`, back with
  `Kind.read`), left out for configs it does not apply to (`applies_to`) and, for a knob with
  `parameter_at_default` false, from studies whose space lists only its default;
- in the config's hash: a knob `added_later` (after hashes were published) is left out at its
  default, so those hashes, and the stores keyed by them, stay valid; best tables written
  before it lack its columns and get them from the config;
- in a best table: one column per field, of its value's kind (`columns`, `cells`);
- in the object's name (`in_name`) and on the dashboard (`label`, and `texts` for values).

The space-file schema (space/_spec.py), the Optuna parameters (search/_params.py), the best
tables' knob columns and the dashboard derive from these declarations. Adding a knob is its
field and its entry here, its rule in space/_rules.py and its use in the kernel template
(render.py passes every number and flag knob to it).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import types
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from . import _rules
from ._epilogue import Epilogue
from ._kinds import Choice, Cluster, Flag, Kind, Number, NumberOrAuto, member, spelling
from ._operation import Operation
from ._types import (
    AUTO_EPILOGUE_TILE,
    AUTO_STAGES,
    PAIRED_EPILOGUE,
    Decomposition,
    DType,
    EpilogueSchedule,
    KernelSchedule,
    RasterOrder,
    Scaling,
    TileScheduler,
)


def _always(_: Any) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class Knob:
    """One knob and every spelling of it (see the module's docstring)."""

    name: str
    """Key in space files, Optuna parameter, dashboard column."""
    kind: Kind
    in_name: Callable[[Any], str]
    """Its part of the name of a config or run-time variant holding it."""
    label: str
    """What the dashboard calls it."""
    fields: tuple[str, ...] = ()
    """The fields it sets, each a table column; its name alone when empty."""
    auto: Callable[[Any], Any] | None = None
    """The value the word auto stands for, given the knobs before it (as attributes)."""
    applies_to: Callable[[Any], bool] = _always
    """Whether the knob means something for a `KernelConfig`: studies leave it out where not."""
    added_later: bool = False
    """Added after config hashes were published: `KernelConfig.to_dict` leaves its fields out
    at their default, and best tables written before it lack its columns."""
    parameter_at_default: bool = True
    """False: a study whose space lists only its default has no parameter for it."""
    auto_values: tuple[Any, ...] = ()
    """The values `kernels: auto` tries (field values, a tuple each for a knob of several
    fields; never the word auto); empty: its default alone."""
    default: Any = None
    """Its value in a default-constructed owner (filled in by `_declare`)."""
    value_types: tuple[type, ...] = ()
    """The type of each field's value (filled in by `_declare`)."""

    def of(self, owner: Any) -> Any:
        """The knob's value in a config or run-time variant, as a space file gives it."""
        if len(self.fields) == 1:
            value = getattr(owner, self.fields[0])
        else:
            value = tuple(getattr(owner, f) for f in self.fields)
        return "auto" if self.auto is not None and value == self.auto(owner) else value

    def assign(self, value: Any, before: Mapping[str, Any]) -> dict[str, Any]:
        """The fields that hold `value`, given the fields of the knobs before it."""
        if self.auto is not None and value == "auto":
            value = self.auto(types.SimpleNamespace(**before))
        return dict(zip(self.fields, value if len(self.fields) > 1 else (value,)))

    def text(self, owner: Any) -> str:
        """The knob's value in `owner` as its Optuna choice and dashboard label."""
        return self.kind.text(self.of(owner))

    def problems(self, owner: Any) -> list[tuple[str, str]]:
        """Each field of `owner` whose value the knob's rule refuses, with the problem."""
        rule = self.kind.rule
        found = ((f, rule(getattr(owner, f))) for f in self.fields) if rule else ()
        return [(f, problem) for f, problem in found if problem]


def column_kind(value_type: type) -> str:
    """The kind of a table column holding values of `value_type`: text, flag or integer."""
    if issubclass(value_type, enum.Enum):
        return "text"
    return "flag" if value_type is bool else "integer"


def _cell(v: Any) -> Any:
    if isinstance(v, Epilogue):
        return v.name
    return spelling(v) if isinstance(v, enum.Enum) else v


def _from_cell(default: Any, v: Any) -> Any:
    if isinstance(default, Epilogue):
        return Epilogue.parse(v) if isinstance(v, str) else v
    return member(type(default), v) if isinstance(default, enum.Enum) else v


def _from_dict(cls: type, data: Mapping[str, Any]) -> Any:
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    unknown = set(data) - set(defaults)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
    return cls(**{k: _from_cell(defaults[k], v) for k, v in data.items()})


def _from_knobs(cls: _Owner, values: Mapping[str, Any], fields: Mapping[str, Any]) -> Any:
    built = dict(fields)
    for knob in cls.knobs:
        built.update(knob.assign(values.get(knob.name, knob.default), built))
    return cls(**built)


@dataclasses.dataclass(frozen=True)
class KernelConfig(Operation):
    """Everything that changes the compiled binary: a kernel for its `operation` (the fields it
    takes from `Operation`, keyword-only), C's and the accumulator's types, its `knobs` and
    `arch`. Target: sm90a.

    Construct freely (`for_operation` for a config of a problem's operation); `space.check_config`
    says whether CUTLASS can build it. Only configs with no rejection may be rendered.
    """

    knobs: ClassVar[tuple[Knob, ...]]

    dtype_c: DType = DType.BF16
    """C's type: D's (`space.check_config`), as `for_operation` sets it."""
    dtype_acc: DType = DType.F32
    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 64
    cluster_m: int = 1
    cluster_n: int = 1
    stages: int = AUTO_STAGES
    kernel_schedule: KernelSchedule = KernelSchedule.COOPERATIVE
    epilogue_schedule: EpilogueSchedule = EpilogueSchedule.TMA_COOPERATIVE
    tile_scheduler: TileScheduler = TileScheduler.PERSISTENT
    arch: str = "sm90a"
    fp8_fast_accum: bool = False
    """fp8 only: the FP8FastAccum schedule, which accumulates the whole K loop inside the
    tensor core's reduced-precision accumulator instead of promoting to fp32 every 4 k-steps."""
    epilogue_tile_n: int = AUTO_EPILOGUE_TILE
    """Columns of the TMA epilogue's subtile (its rows are fixed: 64, or 128 for cooperative);
    AUTO_EPILOGUE_TILE lets CUTLASS choose (32 for 16-bit outputs)."""
    epilogue_source: bool = True
    """False builds a kernel with no C operand (ElementC void): D = alpha * A @ B only. Its
    epilogue keeps no shared-memory buffers for C and issues its TMA stores without waiting
    for C loads. Every launch cutlass-tune makes has beta = 0, so both kinds serve it."""
    swap_ab: bool = False
    """fp8 row-wise or dense block-wise only: the kernel computes the transposed problem
    D^T = B^T A^T (B's rows as its M, A's as its N, D written column-major: D's row-major
    memory), so that a small M takes the tile's N side; tile M/N and cluster M/N then apply to
    N/M of the problem. The caller passes the operands and scales as for any kernel: the swap
    is inside the kernel's arguments."""
    scale_n: int = _rules.BLOCKWISE_K
    """Block-wise only: the columns of B (N) one of the scales the kernel reads covers, and its
    tile N (swapped, its tile M: B's N is the kernel's M). Below 128 the kernel reads the
    caller's 128 x 128 block scales repeated along N (`expand_blockwise_scale_b`; the bench and
    `runtime.Gemm` pass them so): the same products, in tiles narrow enough to give a small-M
    GEMM more CTAs."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (enum values as strings); inverse of `from_dict`.

        The fields of knobs added after a config's hash was first published are left out
        while they hold their default, so those hashes, and the stores keyed by them, stay
        valid."""
        later = columns(type(self), added_later=True) + Operation.ADDED_LATER
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in later and type(v) is type(f.default) and v == f.default:
                continue
            out[f.name] = _cell(v)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KernelConfig:
        """Build from `to_dict` output (a field it omits takes its default). Raises
        ValueError/TypeError on unknown keys or values."""
        return _from_dict(cls, data)

    @classmethod
    def for_operation(cls, operation: Operation, **fields: Any) -> KernelConfig:
        """The config of `operation` (C of D's type) with `fields` (knob fields), the rest at
        their defaults."""
        return cls(**operation.operation_fields(), dtype_c=operation.dtype_d, **fields)

    @classmethod
    def from_knobs(cls, values: Mapping[str, Any], operation: Operation = Operation()) -> KernelConfig:
        """The config of `operation` (C of D's type) with each knob's value as `Knob.of` gives
        it (a missing knob takes its default)."""
        return _from_knobs(cls, values, {**operation.operation_fields(), "dtype_c": operation.dtype_d})

    @property
    def hash(self) -> str:
        """Content hash of the config (hex, 16 chars); stable across processes and versions."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def name(self) -> str:
        """Stable human-readable name, e.g. `bf16_tn_128x256x64_c2x1_sauto_cooperative_tma_cooperative_persistent`
        (`_fastaccum` appended for fp8 fast accumulation, `_e64` for a 64-column epilogue
        subtile, `_nosrc` for a kernel without a C operand, then the fused epilogue's name
        and fp8 scaling as `Problem.name` writes them: `_bias+silu`, `_scale-rowcol`; a grouped
        kernel has `_grouped` after the layout)."""
        operands = self.dtype_a.value
        if self.dtype_b != self.dtype_a:
            operands += self.dtype_b.value
        if self.dtype_d != self.dtype_a or self.dtype_c != self.dtype_d:
            operands += f"_{self.dtype_c.value}{self.dtype_d.value}"
        if self.dtype_acc != DType.F32:
            operands += f"_acc{self.dtype_acc.value}"
        grouped = f"_{self.grouping.value}" if self.grouped else ""
        return f"{operands}_{self.layout}{grouped}" + "".join(k.in_name(self) for k in self.knobs) + self.fused


def _stream_k_args(args: RuntimeArgs) -> bool:
    return args.splits != 1 or args.decomposition != Decomposition.HEURISTIC


@dataclasses.dataclass(frozen=True)
class RuntimeArgs:
    """Run-time knobs of a compiled kernel, set in `Arguments::scheduler`.

    `splits` and `decomposition` mean something only for Stream-K kernels; leave the defaults
    for others.
    """

    knobs: ClassVar[tuple[Knob, ...]]

    raster: RasterOrder = RasterOrder.HEURISTIC
    swizzle: int = 1
    splits: int = 1
    decomposition: Decomposition = Decomposition.HEURISTIC

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (enums by name, in lower case); inverse of `from_dict`."""
        return {f.name: _cell(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RuntimeArgs:
        """Build from `to_dict` output. Raises ValueError/TypeError/KeyError on unknown keys
        or values."""
        return _from_dict(cls, data)

    @classmethod
    def from_knobs(cls, values: Mapping[str, Any]) -> RuntimeArgs:
        """The variant with each knob's value (a missing knob takes its default)."""
        return _from_knobs(cls, values, {})

    @property
    def name(self) -> str:
        return "".join(k.in_name(self) for k in self.knobs)


_Owner = type[KernelConfig] | type[RuntimeArgs]


def _declare(owner: _Owner, *knobs: Knob) -> None:
    """Set `owner.knobs`, each knob with its fields, their types and its default."""
    default = owner()
    out = []
    for knob in knobs:
        fields = knob.fields or (knob.name,)
        knob = dataclasses.replace(knob, fields=fields,
                                   value_types=tuple(type(getattr(default, f)) for f in fields))
        out.append(dataclasses.replace(knob, default=knob.of(default)))
    owner.knobs = tuple(out)


def _fp8(cfg: KernelConfig) -> bool:
    return cfg.dtype_a.is_fp8 and cfg.dtype_b.is_fp8


def _swappable(cfg: KernelConfig) -> bool:
    return not _rules.swap_ab_operation_problem(cfg)


def _blockwise(cfg: KernelConfig) -> bool:
    return cfg.scaling is Scaling.BLOCKWISE


def _stream_k(cfg: KernelConfig) -> bool:
    return cfg.tile_scheduler is TileScheduler.STREAM_K


_declare(
    KernelConfig,
    Knob("tile_m", Number(_rules.tile_m_problem), lambda c: f"_{c.tile_m}", "tile M", auto_values=(64, 128, 256)),
    Knob("tile_n", Number(_rules.tile_n_problem), lambda c: f"x{c.tile_n}", "tile N",
         auto_values=tuple(range(16, 257, 16))),
    Knob("tile_k", Number(_rules.tile_k_problem), lambda c: f"x{c.tile_k}", "tile K", auto_values=(32, 64, 128, 256)),
    Knob("cluster", Cluster(_rules.cluster_dim_problem, _rules.MAX_CLUSTER_CTAS),
         lambda c: f"_c{c.cluster_m}x{c.cluster_n}", "cluster", fields=("cluster_m", "cluster_n"),
         auto_values=tuple((m, n) for m in (1, 2, 4) for n in (1, 2, 4))),
    Knob("stages", NumberOrAuto(_rules.stages_problem, f"a number from 2 to {_rules.MAX_FIXED_STAGES}",
                                AUTO_STAGES),
         lambda c: "_s" + ("auto" if c.stages == AUTO_STAGES else str(c.stages)), "stages",
         auto_values=(AUTO_STAGES, *range(2, _rules.MAX_FIXED_STAGES + 1))),
    Knob("kernel_schedule", Choice(KernelSchedule), lambda c: f"_{c.kernel_schedule.value}", "schedule",
         auto_values=tuple(KernelSchedule)),
    Knob("epilogue_schedule", Choice(EpilogueSchedule, auto=True), lambda c: f"_{c.epilogue_schedule.value}",
         "epilogue", auto=lambda c: PAIRED_EPILOGUE[c.kernel_schedule], auto_values=tuple(EpilogueSchedule)),
    Knob("tile_scheduler", Choice(TileScheduler), lambda c: f"_{c.tile_scheduler.value}", "tile scheduler",
         auto_values=tuple(TileScheduler)),
    Knob("fp8_fast_accum", Flag(_rules.fp8_fast_accum_problem),
         lambda c: "_fastaccum" if c.fp8_fast_accum is True else "", "fp8 fast accumulation",
         applies_to=_fp8, added_later=True, auto_values=(False, True)),
    Knob("epilogue_tile_n", NumberOrAuto(_rules.epilogue_tile_n_problem,
                                         "a multiple of 16 between 16 and 256", AUTO_EPILOGUE_TILE),
         lambda c: f"_e{c.epilogue_tile_n}" if c.epilogue_tile_n != AUTO_EPILOGUE_TILE else "",
         "epilogue tile N", added_later=True, parameter_at_default=False,
         auto_values=(AUTO_EPILOGUE_TILE, *range(16, 257, 16))),
    Knob("epilogue_source", Flag(_rules.epilogue_source_problem),
         lambda c: "_nosrc" if c.epilogue_source is False else "", "C operand",
         added_later=True, parameter_at_default=False, auto_values=(True, False)),
    Knob("swap_ab", Flag(_rules.swap_ab_problem), lambda c: "_swapab" if c.swap_ab is True else "",
         "A/B swapped", applies_to=_swappable, added_later=True, parameter_at_default=False,
         auto_values=(False, True)),
    Knob("scale_n", Number(_rules.scale_n_problem),
         lambda c: f"_sn{c.scale_n}" if c.scale_n != _rules.BLOCKWISE_K else "", "B scale granularity N",
         applies_to=_blockwise, added_later=True, parameter_at_default=False),
)

_declare(
    RuntimeArgs,
    Knob("raster", Choice(RasterOrder), lambda a: f"r{spelling(a.raster)}", "raster"),
    Knob("swizzle", Number(_rules.swizzle_problem), lambda a: f"_sw{a.swizzle}", "swizzle"),
    Knob("splits", Number(_rules.splits_problem), lambda a: f"_sp{a.splits}" if _stream_k_args(a) else "",
         "splits", applies_to=_stream_k),
    Knob("decomposition", Choice(Decomposition),
         lambda a: f"_{spelling(a.decomposition)}" if _stream_k_args(a) else "", "decomposition",
         applies_to=_stream_k),
)


def columns(owner: _Owner, *, added_later: bool = False) -> tuple[str, ...]:
    """The table columns of `owner`'s knobs (`KernelConfig` or `RuntimeArgs`), in order; with
    `added_later`, only those of knobs added later (which older tables lack)."""
    return tuple(f for k in owner.knobs if k.added_later or not added_later for f in k.fields)


def column_kinds(owner: _Owner) -> dict[str, str]:
    """Each knob column of `owner` and its `column_kind`."""
    return {f: column_kind(t) for k in owner.knobs for f, t in zip(k.fields, k.value_types)}


def cells(owner: KernelConfig | RuntimeArgs) -> dict[str, Any]:
    """The knob columns of a config or run-time variant: numbers and flags as they are, enum
    members by their `spelling`."""
    return {f: _cell(getattr(owner, f)) for f in columns(type(owner))}


def texts(owner: KernelConfig | RuntimeArgs) -> dict[str, str]:
    """Each knob's value in `owner` as text, by knob name (`Knob.text`)."""
    return {k.name: k.text(owner) for k in owner.knobs}
