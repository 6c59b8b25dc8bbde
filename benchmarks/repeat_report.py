"""Stability of paired ratios over the passes of `cutlass-tune bench --repeat N`.

For each problem and kernel: its best run-time variant in each pass (by paired ratio), the
ratio of each pass, and their median and range; then per problem the kernel with the best
median. Only paired measurements count.

    python3 benchmarks/repeat_report.py results/bench-winners-paired-h200-20261121.jsonl
"""

from __future__ import annotations

import statistics
import sys

from cutlass_tune.measurement import read_jsonl


def main(path: str) -> None:
    best: dict[tuple, dict[int, float]] = {}
    tflops: dict[tuple, list[float]] = {}
    for m in read_jsonl(path):
        if m.paired_ratio is None:
            continue
        key = (m.problem.m, m.problem.n, m.problem.k, m.problem.name, m.kernel_name)
        passes = best.setdefault(key, {})
        if m.paired_ratio > passes.get(m.repeat, 0.0):
            passes[m.repeat] = m.paired_ratio
        tflops.setdefault(key, []).append(m.tflops)
    print("| problem | kernel | ratio per pass (best variant) | median | range |")
    print("|---|---|---|---|---|")
    winners = {}
    for key in sorted(best):
        ratios = [best[key][r] for r in sorted(best[key])]
        med = statistics.median(ratios)
        print(f"| {key[3]} | {key[4]} | {' / '.join(f'{r:.3f}' for r in ratios)} | {med:.3f} | "
              f"{max(ratios) - min(ratios):.3f} |")
        if med > winners.get(key[3], (0.0, ""))[0]:
            winners[key[3]] = (med, key[4], min(ratios), max(ratios))
    print("\n| problem | best kernel by median | median ratio | lowest-highest pass |")
    print("|---|---|---|---|")
    for problem, (med, kernel, lo, hi) in winners.items():
        print(f"| {problem} | {kernel} | {med:.3f} | {lo:.3f}-{hi:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1])
