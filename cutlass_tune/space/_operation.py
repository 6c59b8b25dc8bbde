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
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from ._types import DType, Epilogue, Layout, Scaling, layout_code

_LAYOUTS = {layout_code(a, b): (a, b) for a in Layout for b in Layout}
_NAME = re.compile(r"(?P<dtypes>[a-z0-9]+)_(?P<layout>[tn]{2})(?P<rest>(?:_.+)?)")
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
    ADDED_LATER: ClassVar[tuple[str, ...]] = ("epilogue", "scaling")
    """Fields added after config hashes and tables were published: dicts leave them out at
    their defaults (the plain GEMM), and tables written before them lack their columns."""
    COLUMNS: ClassVar[tuple[str, ...]] = ("dtype_a", "dtype_b", "dtype_d", "layout", "epilogue", "scaling")
    """A table's columns for an operation (`cells`): the layouts as one BLAS-style code."""

    dtype_a: DType = DType.BF16
    dtype_b: DType = DType.BF16
    dtype_d: DType = DType.BF16
    layout_a: Layout = Layout.ROW
    layout_b: Layout = Layout.COL
    epilogue: Epilogue = Epilogue()
    scaling: Scaling = Scaling.NONE

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
    def fused(self) -> str:
        """What follows the GEMM in names: "_bias+silu", "_scale-rowcol", both, or nothing."""
        return (f"_{self.epilogue.name}" if not self.epilogue.is_plain else "") + (
            f"_scale-{self.scaling.value}" if self.scaling is not Scaling.NONE else "")

    @property
    def name(self) -> str:
        """E.g. "bf16bf16bf16_tn", "e4m3e4m3bf16_tn_bias+silu_scale-rowcol" (`parse` reads it)."""
        return f"{self.dtype_a.value}{self.dtype_b.value}{self.dtype_d.value}_{self.layout}{self.fused}"

    @property
    def words(self) -> str:
        """The epilogue and scaling for a message: "the plain a @ b", "bias+silu", "bias+silu, scale-rowcol"."""
        parts = ([] if self.epilogue.is_plain else [self.epilogue.name]) + (
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
                  layout_b=layout_b, epilogue=Epilogue.parse(rest[1:]) if rest else Epilogue(), scaling=scaling)
        if out.name != text:
            raise ValueError(f"operation {text[:60]!r}: write it as {out.name!r}")
        return out

    def cells(self) -> dict[str, str]:
        """The operation's table columns (`COLUMNS`), as text."""
        return {"dtype_a": self.dtype_a.value, "dtype_b": self.dtype_b.value, "dtype_d": self.dtype_d.value,
                "layout": self.layout, "epilogue": self.epilogue.name, "scaling": self.scaling.value}

    @classmethod
    def from_cells(cls, row: Mapping[str, Any]) -> Operation:
        """Inverse of `cells`; a row without the `ADDED_LATER` columns (or with them empty) is
        of the plain GEMM. Raises ValueError or KeyError for a value it does not know."""
        layout_a, layout_b = _LAYOUTS[row["layout"]]
        return cls(dtype_a=DType(row["dtype_a"]), dtype_b=DType(row["dtype_b"]), dtype_d=DType(row["dtype_d"]),
                   layout_a=layout_a, layout_b=layout_b, epilogue=Epilogue.parse(_text(row.get("epilogue"))),
                   scaling=Scaling(_text(row.get("scaling"))))

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


@dataclasses.dataclass(frozen=True, repr=False)
class Problem(Operation):
    """One GEMM: `Operation` at the shape D[M,N] = A[M,K] @ B[K,N]. Built as
    `Problem(m, n, k, dtype_a=..., epilogue=...)` (the operation's fields by keyword)."""

    m: int
    n: int
    k: int

    def __repr__(self) -> str:
        return f"Problem({self.name})"

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def name(self) -> str:
        """E.g. "4096x4096x4096_bf16bf16bf16_tn", "..._tn_bias+silu" (`Operation.name` after the shape)."""
        return f"{self.m}x{self.n}x{self.k}_{super().name}"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict: the shape, and every operation field (the epilogue by name)."""
        return {"m": self.m, "n": self.n, "k": self.k, **{f: _json(v) for f, v in self.operation_fields().items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Problem:
        """Inverse of `to_dict`; records written before an `ADDED_LATER` field read it at its default."""
        return cls(data["m"], data["n"], data["k"], **Operation.from_dict(data).operation_fields())
