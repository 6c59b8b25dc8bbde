"""Count a sweep store's kernel rows, for the interrupt and shared-store checks.

    python3 benchmarks/store_rows.py wait URL N   # block until the store holds N kernel rows (240 s at most)
    python3 benchmarks/store_rows.py count URL    # rows, repeats, rows per config and per run, best ratios
"""

import collections
import sys
import time

from cutlass_tune.store import ResultStore, StoredRow


def kernel_rows(url: str, columns: list[str] | None = None) -> list[StoredRow]:
    return [r for r in ResultStore(url).rows(columns) if r.kernel != "cuBLAS"]


def wait(url: str, n: int) -> None:
    start = time.time()
    while time.time() - start < 240:
        try:
            found = len(kernel_rows(url, ["kernel"]))
        except Exception:  # noqa: BLE001 - the sweep may still be creating the store
            found = 0
        if found >= n:
            print("rows", found)
            return
        time.sleep(0.2)


def count(url: str) -> None:
    rows = kernel_rows(url)
    keys = collections.Counter((r.problem, r.config_hash, r.runtime) for r in rows)
    per = collections.Counter(r.config_hash for r in rows)
    print("kernel rows", len(rows), "distinct", len(keys), "repeated", sum(v - 1 for v in keys.values()))
    print("rows per config", sorted(per.values()), "status", dict(collections.Counter(r.status.value for r in rows)))
    print("rows per run", dict(collections.Counter(r.run_id for r in rows)))
    print("best ratio per problem", {p: round(max(r.ratio for r in rows if r.problem == p and r.ratio), 3)
                                     for p in sorted({r.problem for r in rows})})


if __name__ == "__main__":
    if sys.argv[1] == "wait":
        wait(sys.argv[2], int(sys.argv[3]))
    else:
        count(sys.argv[2])
