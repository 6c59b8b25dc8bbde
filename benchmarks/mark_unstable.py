"""Apply the benchmark worker's stability rule to measurements stored before it existed.

A measurement whose kernel or paired-baseline samples scatter by more than
`UNSTABLE_SPREAD` ((p80 - p20) / median) is marked `unstable`: its figures stay in the row
and the record, its status and reason change, and nothing ranks by it any more. Prints every
row it marks; `--dry-run` changes nothing.

    python3 benchmarks/mark_unstable.py [--dry-run] sqlite:///results/squares-paired-nvidia-h200.sqlite ...
"""

from __future__ import annotations

import json
import sys

import sqlalchemy as sa

from cutlass_tune.bench import Measurement, TimingStats
from cutlass_tune.bench._runner import UNSTABLE_SPREAD
from cutlass_tune.status import Status
from cutlass_tune.store import ResultStore
from cutlass_tune.store._sql import measurements_table as table


def _spread(median: float | None, p20: float | None, p80: float | None) -> float:
    if not median or p20 is None or p80 is None:
        return 0.0
    return TimingStats(median_ms=median, p20_ms=p20, p80_ms=p80, samples=0).spread


def mark(url: str, dry_run: bool) -> int:
    store = ResultStore(url)
    with store.engine.begin() as conn:
        rows = conn.execute(sa.select(table.c.id, table.c.record).where(table.c.status == Status.OK.value)).all()
        marked = 0
        for row_id, record in rows:
            m = Measurement.from_dict(json.loads(record))
            spread = max(_spread(m.median_ms, m.p20_ms, m.p80_ms),
                         _spread(m.baseline_median_ms, m.baseline_p20_ms, m.baseline_p80_ms))
            if spread <= UNSTABLE_SPREAD:
                continue
            marked += 1
            reason = (f"timing spread (p80 - p20) / median {spread:.2f}, above {UNSTABLE_SPREAD}: marked "
                      "after the run by benchmarks/mark_unstable.py (measured once, never re-timed)")
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
