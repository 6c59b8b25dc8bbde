"""Every measurement of results stores and `bench` files as one flat table a program can learn from.

One row per measurement: the problem, every knob of the kernel's config and of its run-time
variant as its own column, the outcome (status, short reason, timing figures, the cuBLAS figure
and the ratio to it), how it was timed, on which GPU, and where the row came from (`source`,
`run_id`). Stores are read through `ResultStore.measurements()`, `bench` files through
`read_jsonl`, so the table decodes records exactly as the tool does.
"""

from __future__ import annotations

import dataclasses
import enum
import gzip
import io
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import pandas as pd

from .._files import write_atomically
from ..measurement import Measurement, read_jsonl
from ..space import KernelConfig, Operation, RuntimeArgs
from ..store import ResultStore, sqlite_url

PROBLEM_COLUMNS = ("m", "n", "k", *Operation.FIELDS, "layout")
CONFIG_COLUMNS = tuple(f.name for f in dataclasses.fields(KernelConfig) if f.name not in PROBLEM_COLUMNS)
"""The config's knobs that the problem does not already fix (its types and layouts do)."""
RUNTIME_COLUMNS = tuple(f.name for f in dataclasses.fields(RuntimeArgs))
REASON_CHARS = 160
"""Reasons are cut to this length: their first line names the failure; the rest is a log."""


@dataclasses.dataclass(frozen=True)
class _Origin:
    """What a measurement's record does not carry: where it came from and its store's verdict."""

    source: str
    run_id: str
    gpu: str | None
    cublas_tflops: float | None = None
    ratio: float | None = None


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _row(m: Measurement, origin: _Origin) -> dict[str, Any]:
    p = m.problem
    row: dict[str, Any] = {**p.to_dict(), "layout": p.layout}
    row.update(kernel=m.kernel_name, is_baseline=m.is_baseline,
               config_hash=m.config.hash if m.config is not None else None)
    row.update({name: _plain(getattr(m.config, name)) if m.config is not None else None for name in CONFIG_COLUMNS})
    row.update(m.runtime.to_dict())
    reason = m.reason.strip().splitlines()[0] if m.reason.strip() else ""
    row.update(
        status=m.status.value, reason=reason[:REASON_CHARS],
        median_ms=m.median_ms, p20_ms=m.p20_ms, p80_ms=m.p80_ms, samples=m.samples, tflops=m.tflops,
        cublas_tflops=m.baseline_tflops or origin.cublas_tflops,
        ratio=m.paired_ratio or origin.ratio, paired=m.baseline_median_ms is not None,
        rel_error=m.rel_error, worst_error=m.worst_error, throttled=m.throttled,
        sm_mhz=m.clocks.sm_mhz if m.clocks else None, compile_seconds=m.compile_seconds, repeat=m.repeat,
        method=m.method, gpu=origin.gpu or (m.env.gpu if m.env else None),
        source=origin.source, run_id=origin.run_id,
    )
    return row


def _store_rows(path: Path) -> Iterator[dict[str, Any]]:
    store = ResultStore(sqlite_url(path))
    # rows() and measurements() both list the store in insertion order, one entry per measurement.
    stored = store.rows(["run_id", "gpu", "cublas_tflops", "ratio"])
    records = store.measurements()
    if len(stored) != len(records):
        raise ValueError(f"{path}: the store changed while it was read")
    for r, m in zip(stored, records):
        assert r.run_id is not None, "a column read, never NULL"
        yield _row(m, _Origin(path.name, r.run_id, r.gpu, r.cublas_tflops, r.ratio))


def _bench_rows(path: Path) -> Iterator[dict[str, Any]]:
    # A bench file holds one run, which its name tells apart.
    for m in read_jsonl(path):
        yield _row(m, _Origin(path.name, path.stem, None))


def measurements_frame(sources: Iterable[str | Path]) -> pd.DataFrame:
    """One row per measurement of every source, in the order given and stored.

    Args:
        sources: SQLite stores (`.sqlite`) and `cutlass-tune bench` files (`.jsonl`).

    Returns:
        Columns `PROBLEM_COLUMNS`, `kernel`, `is_baseline`, `config_hash`, `CONFIG_COLUMNS`
        (empty for cuBLAS rows), `RUNTIME_COLUMNS`, then status, reason, timing figures,
        `cublas_tflops` and `ratio` (paired where `paired`, else the store's baseline of the
        batch; bench files' unpaired rows have none), `method`, `gpu`, `source` (file name)
        and `run_id` (a bench file's stem).

    Raises:
        ValueError: a source that is neither kind, or a record no known schema reads.
        StoreError: a store that cannot be read.
    """
    rows: list[dict[str, Any]] = []
    for source in map(Path, sources):
        if source.suffix == ".sqlite":
            rows.extend(_store_rows(source))
        elif source.suffix == ".jsonl":
            rows.extend(_bench_rows(source))
        else:
            raise ValueError(f"{source}: not a results store (.sqlite) or bench file (.jsonl)")
    return pd.DataFrame(rows)


def write_frame(frame: pd.DataFrame, path: str | Path) -> None:
    """Publish `frame` whole as gzip-compressed CSV, which pandas reads back alone (no pyarrow).
    The gzip header carries no time and no name, so the same rows give the same bytes.

    Raises:
        FileWriteError: `path` cannot be written.
    """
    def write(f: IO[bytes]) -> None:
        with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as packed:
            with io.TextIOWrapper(packed, encoding="utf-8", newline="") as text:
                frame.to_csv(text, index=False)

    write_atomically(Path(path), write, binary=True)
