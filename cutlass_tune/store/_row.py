"""One row of the store's measurements table, as its readers see it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from ..measurement import Measurement
from ..status import Status


class DamagedRowError(ValueError):
    """A row holds what its column cannot hold (a figure that is not a number, an unknown
    status): the store was edited or damaged. `ResultStore` raises it as a `StoreError`."""


@dataclasses.dataclass(frozen=True)
class StoredRow:
    """A measurement as the store holds it: one attribute per column of `ct_measurements`.

    A row carries its `id` and the columns it was read with; the others are None (a reader
    asks for few columns: `record` is large). A column read may also be None where the store
    holds NULL (a baseline's `config_hash`, a failure's figures).
    """

    id: int
    gpu: str | None = None
    problem: str | None = None
    m: int | None = None
    n: int | None = None
    k: int | None = None
    dtype_a: str | None = None
    dtype_b: str | None = None
    dtype_d: str | None = None
    layout: str | None = None
    kernel: str | None = None
    config_hash: str | None = None
    runtime: str | None = None
    status: Status | None = None
    reason: str | None = None
    median_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    samples: int | None = None
    tflops: float | None = None
    cublas_tflops: float | None = None
    ratio: float | None = None
    compile_seconds: float | None = None
    throttled: bool | None = None
    run_id: str | None = None
    study: str | None = None
    trial: int | None = None
    created_at: str | None = None
    record: str | None = None
    """`Measurement.to_dict()` as JSON: the measurement itself, lossless."""
    epilogue: str | None = None
    """The problem's fused epilogue, as `Epilogue.name` ('none' in rows written before it; schema 2)."""
    scaling: str | None = None
    """The problem's fp8 scaling mode, as `Scaling`'s value ('none' in rows written before it; schema 2)."""
    regime: str | None = None
    """The timing regime, as `RegimeSpec.name` ('sustained' in rows written before it; schema 3)."""

    @classmethod
    def from_columns(cls, columns: Mapping[str, Any]) -> StoredRow:
        """The row of the columns read (name -> value as the database gives it).

        Raises:
            DamagedRowError: a column holds a value of the wrong kind (SQLite keeps whatever
                was written: `'abc'` in a figure's column) or a status no version wrote.
        """
        for name, value in columns.items():
            kind = _KINDS.get(name)
            if value is not None and kind is not None and (
                    not isinstance(value, kind) or (isinstance(value, bool) and name != "throttled")):
                raise DamagedRowError(f"measurement {columns.get('id')}: {name} holds {value!r:.40}, "
                                      f"not {_KIND_NAMES[kind]}")
        status = columns.get("status")
        if status is None:
            return cls(**columns)
        try:
            return cls(**{**columns, "status": Status(status)})
        except ValueError as err:
            raise DamagedRowError(f"measurement {columns.get('id')}: unknown status {status!r:.40}") from err

    def values(self, columns: Iterable[str]) -> dict[str, Any]:
        """The named columns as the table holds them (the status as its text)."""
        return {c: self.status.value if c == "status" and self.status is not None else getattr(self, c)
                for c in columns}

    def measurement(self) -> Measurement:
        """The measurement rebuilt from `record` (the row must have been read with it).

        Raises:
            DamagedRowError: a record that is not JSON, is nested past the recursion limit, or
                that no known schema reads (`null`, a list, a field of the wrong kind): one line
                naming the row.
        """
        assert self.record is not None, "the row was read without its record"
        try:
            data = json.loads(self.record)
            if not isinstance(data, dict):
                raise TypeError(f"the record is {type(data).__name__}, not an object")
            return Measurement.from_dict(data)
        except RecursionError as err:
            raise DamagedRowError(f"measurement {self.id}: its record is nested too deeply to read") from err
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            text = " ".join(str(err).split())[:160]
            raise DamagedRowError(f"measurement {self.id}: its record cannot be read ({type(err).__name__}: "
                                  f"{text})") from err


_NUMBER = (int, float)
_KINDS: dict[str, Any] = {
    **{f.name: int for f in dataclasses.fields(StoredRow) if f.type in ("int | None", "int")},
    **{f.name: _NUMBER for f in dataclasses.fields(StoredRow) if f.type == "float | None"},
    **{f.name: str for f in dataclasses.fields(StoredRow) if f.type == "str | None"},
    "throttled": (bool, int),
}
"""The Python types each column's values may have as the database gives them."""
_KIND_NAMES: dict[Any, str] = {int: "an integer", _NUMBER: "a number", str: "text", (bool, int): "a boolean"}
