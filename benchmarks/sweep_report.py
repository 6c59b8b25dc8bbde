"""Per problem of a sweep store: cuBLAS, the best kernel, its ratio, and when it was found.

"found at" counts the distinct compiled configs measured on the problem, in the order they were
first measured (the store's insertion order, across resumed runs); a config built for another
type or layout does not count. The ratio uses the cuBLAS figure of the same run (the
paired one where the sweep paired its baselines). "99% at" is the tuning cost: the compiled
configs, and the sweep's wall minutes (summed over resumed runs, idle time between runs left
out), until a kernel within 1% of the final best ratio was measured for the problem.

    python3 benchmarks/sweep_report.py sqlite:///results/sweep-nvidia-h200.sqlite
"""

from __future__ import annotations

import datetime
import sys

from cutlass_tune.search import CONFIRM_STUDY
from cutlass_tune.status import Status
from cutlass_tune.store import ResultStore, StoredRow


def _elapsed_minutes(rows: list[StoredRow]) -> list[float]:
    """For each row, the sweep minutes up to it: time since its run's first row, plus the
    whole length of every earlier run."""
    stamps = [datetime.datetime.fromisoformat(r.created_at) for r in rows]
    first: dict[str, datetime.datetime] = {}
    last: dict[str, datetime.datetime] = {}
    for r, t in zip(rows, stamps):
        first.setdefault(r.run_id, t)
        last[r.run_id] = t
    out, done, seen = [], 0.0, []
    for r, t in zip(rows, stamps):
        if r.run_id not in seen:
            if seen:
                done += (last[seen[-1]] - first[seen[-1]]).total_seconds()
            seen.append(r.run_id)
        out.append((done + (t - first[r.run_id]).total_seconds()) / 60)
    return out


def main(url: str) -> None:
    store = ResultStore(url)
    rows = [r for r in store.rows() if r.study != CONFIRM_STUDY]  # the sweep's own rows
    compiled = {r.config_hash for r in rows if r.config_hash and r.status is not Status.INVALID}
    minutes = _elapsed_minutes(rows)
    print(f"store {url}: GPU {store.gpu()}, {len(compiled)} compiled configs, {len(rows)} rows, "
          f"timing {store.timing()}")
    env = next((m.env for m in store.measurements() if m.env is not None), None)
    if env is not None:
        print(f"{env.gpu} ({env.sm_count} SMs), driver {env.driver}, CUDA {env.cuda_runtime}, "
              f"torch {env.torch}, nvcc {env.nvcc}, CUTLASS {env.cutlass}")
    print("| problem | cuBLAS TFLOP/s | best TFLOP/s | ratio | p20-p80 ms | found at | 99% at | kernel | run-time |")
    print("|---|---|---|---|---|---|---|---|---|")
    for problem in dict.fromkeys(r.problem for r in rows):
        ok = [r for r in rows if r.problem == problem and r.status is Status.OK and r.kernel != "cuBLAS"]
        if not ok:
            print(f"| {problem} | - | - | - | - | - | no kernel passed | - |")
            continue
        order: dict[str, int] = {}  # config hash -> its place among the problem's configs
        for r in rows:
            if r.problem == problem and r.config_hash and r.status is not Status.INVALID:
                order.setdefault(r.config_hash, len(order) + 1)
        best = max(ok, key=lambda r: r.ratio or 0.0)
        first = min(order[r.config_hash] for r in ok if r.config_hash == best.config_hash)
        near = next(i for i, r in enumerate(rows) if r in ok and (r.ratio or 0.0) >= 0.99 * best.ratio)
        print(f"| {problem} | {best.cublas_tflops:.1f} | {best.tflops:.1f} | {best.ratio:.3f} | "
              f"{best.p20_ms:.4f}-{best.p80_ms:.4f} | {first} of {len(order)} | "
              f"{order[rows[near].config_hash]} configs, {minutes[near]:.1f} min | {best.kernel} | "
              f"{best.runtime} |")


if __name__ == "__main__":
    main(sys.argv[1])
