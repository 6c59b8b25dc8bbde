"""Apply the benchmark worker's stability rules to measurements stored before they existed.

A measurement is marked `unstable` when its kernel or paired-baseline samples scatter by more
than `UNSTABLE_SPREAD` ((p80 - p20) / median), or when its paired cuBLAS baseline took more
than `BASELINE_OUTLIER` times the median of every paired baseline of the same problem in the
store: the same cuBLAS call on the same operands does not slow down threefold, so host time
got inside that pair's samples (the worker now drops such samples as it takes them,
`cutlass_tune.bench._timing`). Its figures stay in the row and the record, its status and
reason change, and nothing ranks by it any more. Prints every row it marks; `--dry-run`
changes nothing.

    python3 benchmarks/mark_unstable.py [--dry-run] sqlite:///results/squares-paired-nvidia-h200.sqlite ...
"""

from __future__ import annotations

import json
import statistics
import sys

import sqlalchemy as sa

from cutlass_tune.bench import TimingStats
from cutlass_tune.bench._runner import UNSTABLE_SPREAD
from cutlass_tune.measurement import Measurement
from cutlass_tune.status import Status
from cutlass_tune.store import ResultStore
from cutlass_tune.store._sql import measurements_table as table


def _spread(median: float | None, p20: float | None, p80: float | None) -> float:
    if not median or p20 is None or p80 is None:
        return 0.0
    return TimingStats(median_ms=median, p20_ms=p20, p80_ms=p80, samples=0).spread


BASELINE_OUTLIER = 1.5


def _reason(m: Measurement, typical_baseline: dict[str, float]) -> str | None:
    spread = max(_spread(m.median_ms, m.p20_ms, m.p80_ms),
                 _spread(m.baseline_median_ms, m.baseline_p20_ms, m.baseline_p80_ms))
    if spread > UNSTABLE_SPREAD:
        return (f"timing spread (p80 - p20) / median {spread:.2f}, above {UNSTABLE_SPREAD}: marked "
                "after the run by benchmarks/mark_unstable.py (measured once, never re-timed)")
    typical = typical_baseline.get(m.problem.name)
    if m.baseline_median_ms and typical and m.baseline_median_ms > BASELINE_OUTLIER * typical:
        return (f"paired cuBLAS took {m.baseline_median_ms * 1e3:.1f} us, {m.baseline_median_ms / typical:.1f}x "
                f"the store's median for this problem ({typical * 1e3:.1f} us): host time in the samples; "
                "marked after the run by benchmarks/mark_unstable.py")
    return None


def mark(url: str, dry_run: bool) -> int:
    store = ResultStore(url)
    with store.engine.begin() as conn:
        rows = conn.execute(sa.select(table.c.id, table.c.record).where(table.c.status == Status.OK.value)).all()
        found = [(row_id, record, Measurement.from_dict(json.loads(record))) for row_id, record in rows]
        baselines: dict[str, list[float]] = {}
        for _, _, m in found:
            if m.baseline_median_ms:
                baselines.setdefault(m.problem.name, []).append(m.baseline_median_ms)
        typical = {name: statistics.median(v) for name, v in baselines.items()}
        marked = 0
        for row_id, record, m in found:
            reason = _reason(m, typical)
            if reason is None:
                continue
            marked += 1
            print(f"{url}: row {row_id} {m.problem.name} {m.kernel_name} {m.runtime.name}: {reason}")
            if not dry_run:
                data = {**json.loads(record), "status": Status.UNSTABLE.value, "reason": reason}
                conn.execute(table.update().where(table.c.id == row_id).values(
                    status=Status.UNSTABLE.value, reason=reason, record=json.dumps(data)))
    return marked


def main(args: list[str]) -> None:
    dry_run = "--dry-run" in args
    for url in (a for a in args if a != "--dry-run"):
        print(f"{url}: {mark(url, dry_run)} marked{' (dry run)' if dry_run else ''}")


if __name__ == "__main__":
    main(sys.argv[1:])
