"""What a GEMM computes, declared once, and `Problem`: an operation at a shape.

An `Operation` is everything a kernel is built for besides its knobs: the element types of A, B
and D, the layouts of A and B, the fused epilogue and the fp8 scaling. It is the one key of a
study, a prior's pool of configs, a `kernels: auto` space, a best table's lookup and `matmul`'s
dispatch: a config serves exactly the problems of its operation (`space.check_pair`).

`Problem` and `KernelConfig` (space/_knobs.py) declare none of these fields themselves: they take
them from `Operation` as keyword-only fields, and `.operation` gives the value alone. A field
added here (the grouped kind of MoE expert GEMMs, say) reaches both, their dicts and hashes
(left out at its default while in `ADDED_LATER`, so published hashes stay), their names and the
table columns (`cells`, `from_cells`) without being written again.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Generic, TypeVar

from ._epilogue import Epilogue
from ._types import DType, Grouping, Layout, Routing, Scaling, layout_code

GROUPINGS = frozenset({Grouping.GROUPED, Grouping.GROUPED_K})
"""The groupings of a group of GEMMs (experts and routed rows): `Operation.grouped`."""
_LAYOUTS = {layout_code(a, b): (a, b) for a in Layout for b in Layout}
_NAME = re.compile(r"(?P<dtypes>[a-z0-9]+)_(?P<layout>[tn]{2})(?P<grouped>_grouped(?:-k)?)?(?P<rest>(?:_.+)?)")
_SCALINGS = {s.value for s in Scaling if s is not Scaling.NONE}
_DTYPES = re.compile("|".join(sorted((d.value for d in DType), key=len, reverse=True)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Operation:
    """D = epilogue(A @ B), scaled as `scaling` says for fp8 inputs; the defaults are the plain
    bf16 GEMM of `nn.Linear` (A row-major M x K, B stored N x K, D row-major M x N).

    `layout_b` is the storage of B seen as a K x N matrix: COL means each column (length K) is
    contiguous, i.e. B is stored as N x K row-major (the "TN" GEMM of nn.Linear).
    """

    FIELDS: ClassVar[tuple[str, ...]]
    """The fields, in order (set below from the dataclass)."""
    ADDED_LATER: ClassVar[tuple[str, ...]] = ("epilogue", "scaling", "grouping")
    """Fields added after config hashes and tables were published: dicts leave them out at
    their defaults (the plain GEMM), and tables written before them lack their columns."""
    COLUMNS: ClassVar[tuple[str, ...]] = ("dtype_a", "dtype_b", "dtype_d", "layout", "epilogue", "scaling",
                                          "grouping")
    """A table's columns for an operation (`cells`): the layouts as one BLAS-style code."""

    dtype_a: DType = DType.BF16
    dtype_b: DType = DType.BF16
    dtype_d: DType = DType.BF16
    layout_a: Layout = Layout.ROW
    layout_b: Layout = Layout.COL
    epilogue: Epilogue = Epilogue()
    scaling: Scaling = Scaling.NONE
    grouping: Grouping = Grouping.NONE
    """GROUPED: a group of GEMMs, one per MoE expert (`Grouping`); GROUPED_K: their weight
    gradients, a group whose reduction runs over each expert's rows. A `Problem` of either
    carries the experts and their routed rows."""

    @property
    def operation(self) -> Operation:
        """The operation alone: of a `Problem` or `KernelConfig`, without its shape or knobs."""
        return Operation(**self.operation_fields())

    def operation_fields(self) -> dict[str, Any]:
        """The operation's fields by name, as values (to build a problem or config of it)."""
        return {f: getattr(self, f) for f in Operation.FIELDS}

    @property
    def layout(self) -> str:
        """The layouts of A and B as BLAS letters (`layout_code`), e.g. "tn"."""
        return layout_code(self.layout_a, self.layout_b)

    @property
    def is_plain(self) -> bool:
        """No fused epilogue and no fp8 scaling: cuBLAS's GEMM computes the same."""
        return self.epilogue.is_plain and self.scaling is Scaling.NONE

    @property
    def grouped(self) -> bool:
        """A group of GEMMs, one per expert (`Grouping.GROUPED` or `Grouping.GROUPED_K`)."""
        return self.grouping in GROUPINGS

    @property
    def kind(self) -> OperationKind:
        """What the stages dispatch on (`OperationKind`): grouped or not, and what the mainloop
        multiplies."""
        return _kind(self)

    @property
    def fused(self) -> str:
        """What follows the GEMM in names: "_bias+silu", "_scale-rowcol", both, or nothing."""
        return (f"_{self.epilogue.name}" if not self.epilogue.is_plain else "") + (
            f"_scale-{self.scaling.value}" if self.scaling is not Scaling.NONE else "")

    @property
    def name(self) -> str:
        """E.g. "bf16bf16bf16_tn", "e4m3e4m3bf16_tn_bias+silu_scale-rowcol", "bf16bf16bf16_tn_grouped"
        (`parse` reads it)."""
        grouped = f"_{self.grouping.value}" if self.grouped else ""
        return f"{self.dtype_a.value}{self.dtype_b.value}{self.dtype_d.value}_{self.layout}{grouped}{self.fused}"

    @property
    def words(self) -> str:
        """The epilogue and scaling for a message: "the plain a @ b", "bias+silu", "bias+silu, scale-rowcol"."""
        parts = ([self.grouping.value] if self.grouped else []) + (
            [] if self.epilogue.is_plain else [self.epilogue.name]) + (
            [] if self.scaling is Scaling.NONE else [f"scale-{self.scaling.value}"])
        return ", ".join(parts) or "the plain a @ b"

    @classmethod
    def parse(cls, text: str) -> Operation:
        """Inverse of `name`. Raises ValueError naming what it does not read."""
        found = _NAME.fullmatch(text)
        dtypes = _DTYPES.findall(found["dtypes"]) if found else []
        if not found or len(dtypes) != 3 or "".join(dtypes) != found["dtypes"]:
            raise ValueError(f"operation {text[:60]!r}: expected three types and a layout, e.g. bf16bf16bf16_tn")
        rest, scaling = found["rest"], Scaling.NONE
        if "_scale-" in rest:
            rest, _, scale = rest.rpartition("_scale-")
            if scale not in _SCALINGS:
                raise ValueError(f"operation {text[:60]!r}: unknown scaling {scale[:30]!r}")
            scaling = Scaling(scale)
        layout_a, layout_b = _LAYOUTS[found["layout"]]
        out = cls(dtype_a=DType(dtypes[0]), dtype_b=DType(dtypes[1]), dtype_d=DType(dtypes[2]), layout_a=layout_a,
                  layout_b=layout_b, epilogue=Epilogue.parse(rest[1:]) if rest else Epilogue(), scaling=scaling,
                  grouping=Grouping(found["grouped"][1:]) if found["grouped"] else Grouping.NONE)
        if out.name != text:
            raise ValueError(f"operation {text[:60]!r}: write it as {out.name!r}")
        return out

    def cells(self) -> dict[str, str]:
        """The operation's table columns (`COLUMNS`), as text."""
        return {"dtype_a": self.dtype_a.value, "dtype_b": self.dtype_b.value, "dtype_d": self.dtype_d.value,
                "layout": self.layout, "epilogue": self.epilogue.name, "scaling": self.scaling.value,
                "grouping": self.grouping.value}

    @classmethod
    def from_cells(cls, row: Mapping[str, Any]) -> Operation:
        """Inverse of `cells`; a row without the `ADDED_LATER` columns (or with them empty) is
        of the plain GEMM. Raises ValueError or KeyError for a value it does not know."""
        layout_a, layout_b = _LAYOUTS[row["layout"]]
        return cls(dtype_a=DType(row["dtype_a"]), dtype_b=DType(row["dtype_b"]), dtype_d=DType(row["dtype_d"]),
                   layout_a=layout_a, layout_b=layout_b, epilogue=Epilogue.parse(_text(row.get("epilogue"))),
                   scaling=Scaling(_text(row.get("scaling"))), grouping=Grouping(_text(row.get("grouping"))))

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values (enums by value, the epilogue by name); `ADDED_LATER` fields
        left out at their defaults. Inverse: `from_dict`."""
        return {f: _json(v) for f, v in self.operation_fields().items()
                if f not in self.ADDED_LATER or v != _DEFAULTS[f]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Operation:
        """Inverse of `to_dict` (missing fields take their defaults). Raises ValueError."""
        return cls(**{f: _read(f, data[f]) for f in cls.FIELDS if f in data})


Operation.FIELDS = tuple(f.name for f in dataclasses.fields(Operation))


class Inputs(str, enum.Enum):
    """What the mainloop multiplies, where it changes what a stage does: 16-bit inputs, fp8 ones
    (unscaled, or scaled in the epilogue: tensor, rowcol), or fp8 with block-wise scales, which
    the mainloop applies to each 128-deep K block (its own schedules, operands and references)."""

    WIDE = "16-bit"
    FP8 = "fp8"
    FP8_BLOCKWISE = "fp8-blockwise"


@dataclasses.dataclass(frozen=True)
class OperationKind:
    """The kind of an operation (`Operation.kind`): what the stages dispatch on, each through a
    `KindRegistry` of its own (the render builder, the reference and operands, the baselines,
    the prior's family, the hand-picked seeds). A single GEMM or a group of them, by what its
    mainloop multiplies."""

    grouping: Grouping = Grouping.NONE
    inputs: Inputs = Inputs.WIDE

    @property
    def grouped(self) -> bool:
        return self.grouping in GROUPINGS

    @property
    def blockwise(self) -> bool:
        """fp8 with block-wise scales: the mainloop scales (`Inputs.FP8_BLOCKWISE`)."""
        return self.inputs is Inputs.FP8_BLOCKWISE

    @property
    def name(self) -> str:
        """E.g. "dense 16-bit", "grouped fp8-blockwise", "grouped-k 16-bit"."""
        return f"{self.grouping.value if self.grouped else 'dense'} {self.inputs.value}"

    def __str__(self) -> str:
        return self.name


def _kind(op: Operation) -> OperationKind:
    fp8 = isinstance(op.dtype_a, DType) and op.dtype_a.is_fp8
    inputs = Inputs.FP8_BLOCKWISE if op.scaling is Scaling.BLOCKWISE else Inputs.FP8 if fp8 else Inputs.WIDE
    return OperationKind(op.grouping if isinstance(op.grouping, Grouping) else Grouping.NONE, inputs)


T = TypeVar("T")


class KindRegistry(Generic[T]):
    """One stage's implementations by kind of operation, the shape of the strategy registry
    (search/_strategy.py) keyed by `OperationKind`: an entry is registered for a grouping, an
    inputs kind, both, or neither (the stage's default), and a kind takes the most specific entry
    that matches it (both; its grouping alone; its inputs alone; the default). A new kind is then
    an entry in the registries where it differs, not a branch in each stage.

    Args:
        stage: what the entries are, for the error of a kind without one ("render builder").
    """

    def __init__(self, stage: str):
        self.stage = stage
        self._entries: dict[tuple[Grouping | None, Inputs | None], T] = {}

    def add(self, value: T, *, grouping: Grouping | None = None, inputs: Inputs | None = None) -> T:
        """Register `value` for the kinds of `grouping` and `inputs` (None: any); returns it.
        Raises ValueError if that key has an entry already."""
        key = (grouping, inputs)
        if key in self._entries:
            raise ValueError(f"{self.stage}: {_key_name(key)} is registered already")
        self._entries[key] = value
        return value

    def register(self, *, grouping: Grouping | None = None,
                 inputs: Inputs | None = None) -> Callable[[T], T]:
        """`add` as a decorator."""
        def decorate(value: T) -> T:
            return self.add(value, grouping=grouping, inputs=inputs)
        return decorate

    def __getitem__(self, kind: OperationKind) -> T:
        """The most specific entry for `kind`. Raises LookupError where none matches."""
        for key in ((kind.grouping, kind.inputs), (kind.grouping, None), (None, kind.inputs), (None, None)):
            if key in self._entries:
                return self._entries[key]
        raise LookupError(f"no {self.stage} for {kind.name} operations")

    def __contains__(self, kind: object) -> bool:
        return isinstance(kind, OperationKind) and any(
            key in self._entries for key in ((kind.grouping, kind.inputs), (kind.grouping, None),
                                             (None, kind.inputs), (None, None)))

    def __repr__(self) -> str:
        return f"KindRegistry({self.stage}: {', '.join(_key_name(k) for k in self._entries)})"


def _key_name(key: tuple[Grouping | None, Inputs | None]) -> str:
    grouping, inputs = key
    if key == (None, None):
        return "the default"
    return " ".join([{None: "any", Grouping.NONE: "dense", Grouping.GROUPED: "grouped",
                      Grouping.GROUPED_K: Grouping.GROUPED_K.value}[grouping],
                     inputs.value if inputs else "inputs"])
_DEFAULTS = Operation().operation_fields()


def _text(cell: Any) -> str:
    """A later column's cell: "none" where a table lacks it (None, pandas' NaN, empty)."""
    return cell if isinstance(cell, str) and cell else "none"


def _json(value: Any) -> Any:
    return value.name if isinstance(value, Epilogue) else value.value if isinstance(value, enum.Enum) else value


def _read(field: str, value: Any) -> Any:
    default = _DEFAULTS[field]
    if isinstance(default, Epilogue):
        return value if isinstance(value, Epilogue) else Epilogue.parse(value)
    return type(default)(value)


MAX_GROUPS = 4096
"""The most experts a grouped problem may have (its per-group arrays live in the workspace)."""


def routed_rows(groups: int, rows: int, routing: Routing) -> tuple[int, ...]:
    """`rows` routed rows spread over `groups` experts as `routing` says (UNIFORM or ZIPF;
    a HISTOGRAM's counts are the problem's own): whole counts summing to `rows`, the remainder
    of the rounding given to the largest shares first. Raises ValueError for a histogram or
    counts that are not positive whole numbers."""
    if type(groups) is not int or type(rows) is not int or groups < 1 or rows < 0:
        raise ValueError(f"routed rows need positive whole counts, not {groups!r} experts and {rows!r} rows")
    if routing is Routing.HISTOGRAM:
        raise ValueError("a histogram's routed rows are given with the problem, not derived")
    weights = [1.0] * groups if routing is Routing.UNIFORM else [1.0 / (i + 1) for i in range(groups)]
    total = sum(weights)
    exact = [rows * w / total for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(groups), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[:rows - sum(counts)]:
        counts[i] += 1
    return tuple(counts)


@dataclasses.dataclass(frozen=True, repr=False)
class Problem(Operation):
    """One GEMM: `Operation` at the shape D[M,N] = A[M,K] @ B[K,N]. Built as
    `Problem(m, n, k, dtype_a=..., epilogue=...)` (the operation's fields by keyword).

    A grouped problem (`grouping=Grouping.GROUPED`) is `groups` GEMMs sharing N and K, one per
    expert: M is the routed rows of all experts together and `group_rows` how many each
    expert gets (derived from `routing` when not given; a HISTOGRAM gives them). Build one
    with `Problem.experts`. `space.check_problem` says whether the values make sense.
    """

    m: int
    n: int
    k: int
    groups: int = dataclasses.field(default=0, kw_only=True)
    """Experts of a grouped problem; 0 for a single GEMM."""
    routing: Routing = dataclasses.field(default=Routing.UNIFORM, kw_only=True)
    """How `group_rows` came about (a grouped problem's only)."""
    group_rows: tuple[int, ...] = dataclasses.field(default=(), kw_only=True)
    """Routed rows of each expert, in expert order, summing to M (a grouped problem's only)."""

    def __post_init__(self) -> None:
        if self.grouped and not self.group_rows and self.routing in (Routing.UNIFORM, Routing.ZIPF):
            try:
                object.__setattr__(self, "group_rows", routed_rows(self.groups, self.m, self.routing))
            except ValueError:
                pass  # check_problem names what is wrong
        elif isinstance(self.group_rows, list):
            object.__setattr__(self, "group_rows", tuple(self.group_rows))

    @classmethod
    def experts(cls, groups: int, n: int, k: int, rows: int, *, routing: Routing = Routing.UNIFORM,
                group_rows: tuple[int, ...] = (), **operation: Any) -> Problem:
        """The grouped problem of `groups` experts with N x K weights and `rows` routed rows."""
        return cls(rows, n, k, groups=groups, routing=routing, group_rows=tuple(group_rows),
                   **{"grouping": Grouping.GROUPED, **operation})

    def __repr__(self) -> str:
        return f"Problem({self.name})"

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def experts_name(self) -> str:
        """A grouped problem's experts and routing in names: "e128-uniform", "e128-zipf",
        "e128-histogram-1a2b3c4d" (the counts' digest); empty for a single GEMM."""
        if not self.grouped:
            return ""
        name = f"e{self.groups}-{_value(self.routing)}"
        if self.routing is Routing.HISTOGRAM:
            name += "-" + hashlib.sha256(",".join(map(str, self.group_rows)).encode()).hexdigest()[:8]
        return name

    @property
    def name(self) -> str:
        """E.g. "4096x4096x4096_bf16bf16bf16_tn", "..._tn_bias+silu" (`Operation.name` after the
        shape); a grouped problem's experts last: "32768x1536x2048_bf16bf16bf16_tn_grouped_e128-zipf"."""
        experts = f"_{self.experts_name}" if self.grouped else ""
        return f"{self.m}x{self.n}x{self.k}_{super().name}{experts}"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict: the shape, and every operation field (the epilogue by name); a
        grouped problem's experts, routing and routed rows too."""
        out = {"m": self.m, "n": self.n, "k": self.k, **{f: _json(v) for f, v in self.operation_fields().items()
                                                         if f != "grouping" or self.grouped}}
        if self.grouped:
            out.update(groups=self.groups, routing=_value(self.routing), group_rows=list(self.group_rows))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Problem:
        """Inverse of `to_dict`; records written before an `ADDED_LATER` field read it at its default."""
        experts: dict[str, Any] = {}
        if "groups" in data:
            experts = {"groups": data["groups"], "routing": Routing(data.get("routing", "uniform")),
                       "group_rows": tuple(data.get("group_rows", ()))}
        return cls(data["m"], data["n"], data["k"], **Operation.from_dict(data).operation_fields(), **experts)


def _value(member: Any) -> Any:
    return member.value if isinstance(member, enum.Enum) else member
