"""Best run-time variant per kernel from `cutlass-tune bench` output, as a markdown table.

    python3 benchmarks/summarize_bench.py results/bench-probes-h200-20261121.jsonl
"""

from __future__ import annotations

import sys

from cutlass_tune.bench import baseline_ratio
from cutlass_tune.measurement import read_jsonl
from cutlass_tune.status import Status


def main(path: str) -> None:
    rows = list(read_jsonl(path))
    baselines = {(m.problem, m.repeat): m for m in rows if m.is_baseline and m.status is Status.OK}
    best: dict[tuple, object] = {}
    order: list[tuple] = []
    for m in rows:
        if m.is_baseline or m.status is not Status.OK:
            continue
        key = (m.problem, m.kernel_name, m.repeat)
        if key not in best:
            order.append(key)
        if key not in best or baseline_ratio(m, baselines) > baseline_ratio(best[key], baselines):
            best[key] = m
    env = next(m.env for m in rows if m.env)
    print(f"{env.gpu}, driver {env.driver}, torch {env.torch}, nvcc {env.nvcc}, CUTLASS {env.cutlass}; "
          f"timing {rows[0].method}, L2 flushed, median of each variant; 'vs cuBLAS' is the paired "
          f"baseline's where there is one, else the pass's")
    for (problem, rep), b in baselines.items():
        print(f"\ncuBLAS {problem.name} pass {rep}: {b.tflops:.1f} TFLOP/s "
              f"(median {b.median_ms:.4f} ms, p20-p80 {b.p20_ms:.4f}-{b.p80_ms:.4f}, {b.samples} samples)")
    print("\n| problem | kernel | pass | best variant | TFLOP/s | vs cuBLAS | vs pass baseline | p20-p80 ms |")
    print("|---|---|---|---|---|---|---|---|")
    order.sort(key=lambda k: (k[0].m, k[0].n, k[0].k, k[2], -baseline_ratio(best[k], baselines)))
    for key in order:
        m = best[key]
        base = baselines[(m.problem, m.repeat)]
        print(f"| {m.problem.name} | {m.kernel_name} | {m.repeat} | {m.runtime.name} | {m.tflops:.1f} | "
              f"{baseline_ratio(m, baselines):.3f} | {m.tflops / base.tflops:.3f} | "
              f"{m.p20_ms:.4f}-{m.p80_ms:.4f} |")


if __name__ == "__main__":
    main(sys.argv[1])
