"""The summary `gpu_regimes.sh` writes (`OUT/{moe,fp8}-regimes.txt`, benchmarks/regimes.md): one
line per problem the patterns name, with its sweep ratio, each regime's ratio, SM clock and power
from `best`'s table, and each confirm measurement of it that failed, by regime, with its reason
from the store.

Every problem of the table the patterns name gets its line: one whose regime figures are missing
(its torch side failed, or no regime was confirmed) says so instead of being left out, as two of
the MoE store's four problems were when the summary printed only rows with regime figures.

    python3 benchmarks/regimes_summary.py BEST_CSV STORE [--problem PATTERN ...]
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from cutlass_tune.regime import SUSTAINED
from cutlass_tune.status import Status
from cutlass_tune.store import CONFIRM_STUDY, StoredRow, open_store, resolve_storage
from cutlass_tune.tables import regime_figures

COLUMNS = ("problem", "kernel", "runtime", "status", "reason", "regime", "study")
"""The store's columns the failures are read from."""


def summary(best: Iterable[Mapping[str, Any]], rows: Iterable[StoredRow], patterns: Sequence[str]) -> list[str]:
    """One line per row of `best` (a best table's records) whose problem matches one of
    `patterns` (all where none): its regimes' figures and the failures among the confirm
    measurements `rows` of its problem, each with its count and the first line of its reason."""
    failed: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in rows:
        if r.study == CONFIRM_STUDY and r.status is not None and r.status is not Status.OK:
            reason = ((r.reason or "").strip().splitlines() or ["no reason recorded"])[0][:200]
            failed[str(r.problem)][(r.regime or SUSTAINED.name, str(r.kernel), r.status.value, reason)] += 1
    lines = []
    for row in best:
        problem = str(row["problem"])
        if patterns and not any(fnmatch.fnmatchcase(problem, p) for p in patterns):
            continue
        parts = [f"{name} {ratio:.3f} {mhz:.0f} MHz {watts:.0f} W" for name, ratio, mhz, watts in regime_figures(row)]
        parts += [f"{regime} FAILED {kernel} {status} x{n}: {reason}"
                  for (regime, kernel, status, reason), n in failed.get(problem, {}).items()]
        lines.append(f"{problem[:48]} sweep {float(row['sweep_ratio']):.3f} "
                     + ("; ".join(parts) or "no regime figures and no failure in the store"))
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("best_csv")
    parser.add_argument("store")
    parser.add_argument("--problem", action="append", default=[])
    args = parser.parse_args(argv)
    best = pd.read_csv(args.best_csv, keep_default_na=True)
    best = best.assign(**{c: best[c].astype(object).where(best[c].notna(), "")
                          for c in best.columns if c.endswith("_regime")})
    rows = open_store(resolve_storage(args.store)).rows(COLUMNS)
    for line in summary(best.to_dict("records"), rows, args.problem):
        print(line)


if __name__ == "__main__":
    main()
