"""Per problem of an fp8 block-wise grouped sweep store: torch's paths and the best tuned kernel.

torch has no block-wise grouped GEMM on SM90, so each problem's baseline row times three torch
paths in one sampling loop (events, same operands): dequantize A and the weights to bf16 +
torch._grouped_mm (the baseline kernels are paired with), a per-expert loop of torch._scaled_mm
block-wise, and one dense torch._scaled_mm of all rows (the ceiling, not the same function).
The best kernel's paired ratio to the first is the sweep's; its ratio to the loop is that over the
loop's factor in the baseline row (as the sweep reports torch.compile), and "vs strongest" is
against the faster of the two paths that compute the problem (`Measurement.to_strongest`).

    python3 benchmarks/moe_fp8_ratios.py OUT/store.sqlite
"""

from __future__ import annotations

import math
import sys

from cutlass_tune.measurement import Baseline
from cutlass_tune.status import Status
from cutlass_tune.store import open_store


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def main(source: str) -> None:
    measurements = open_store(source).measurements()
    problems = dict.fromkeys(m.problem for m in measurements)
    print("| problem | dequant + grouped_mm TFLOP/s | expert loop | dense | best tuned | vs dequant + grouped_mm "
          "| vs expert loop | vs strongest | kernel |")
    print("|---|---|---|---|---|---|---|---|---|")
    strongest: list[float] = []
    notes = set()
    for p in problems:
        base = [m for m in measurements if m.problem == p and m.is_baseline and m.status is Status.OK]
        kernels = [m for m in measurements if m.problem == p and not m.is_baseline and m.paired_ratio]
        if not base or not kernels:
            print(f"| {p.name} | {'-' if not base else f'{base[-1].tflops:.0f}'} | - | - | - | - | - | - | "
                  f"{'no kernel passed' if not kernels else 'no baseline'} |")
            continue
        row, best = base[-1], max(kernels, key=lambda m: m.paired_ratio or 0.0)
        notes.add(row.reason)
        loop = row.side_ratio(Baseline.EXPERT_LOOP)  # > 1: the loop is faster than dequant + grouped_mm
        to_loop = best.paired_ratio / loop if loop else math.nan
        side, to_strongest = row.to_strongest(best.paired_ratio) or (Baseline.GROUPED_MM, best.paired_ratio)
        strongest.append(to_strongest)

        def tflops(kind: Baseline) -> str:
            value = row.side_tflops(kind)
            return f"{value:.0f}" if value else "-"

        print(f"| {p.name} | {row.tflops:.0f} | {tflops(Baseline.EXPERT_LOOP)} | {tflops(Baseline.DENSE)} | "
              f"{best.tflops:.0f} | {best.paired_ratio:.3f} | {to_loop:.3f} | {to_strongest:.3f} ({side.value}) | "
              f"{best.kernel_name}, raster {best.runtime.raster.name.lower()} |")
    print(f"geomean vs strongest torch path: {_geomean(strongest):.3f} over {len(strongest)} problems")
    for note in sorted(n for n in notes if n):
        print(f"baseline: {note}")


if __name__ == "__main__":
    main(sys.argv[1])
