"""One row of the store's measurements table, as its readers see it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from ..measurement import Measurement
from ..status import Status


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

    @classmethod
    def from_columns(cls, columns: Mapping[str, Any]) -> StoredRow:
        """The row of the columns read (name -> value as the database gives it)."""
        status = columns.get("status")
        return cls(**{**columns, "status": Status(status)} if status is not None else columns)

    def values(self, columns: Iterable[str]) -> dict[str, Any]:
        """The named columns as the table holds them (the status as its text)."""
        return {c: self.status.value if c == "status" and self.status is not None else getattr(self, c)
                for c in columns}

    def measurement(self) -> Measurement:
        """The measurement rebuilt from `record` (the row must have been read with it).

        Raises:
            What `Measurement.from_dict` raises for a record no known schema reads.
        """
        assert self.record is not None, "the row was read without its record"
        return Measurement.from_dict(json.loads(self.record))
