"""Per-kernel medians over the rounds of an Nsight Compute run of `ncu_profile.py SIZE ROUNDS`:
duration, elapsed cycles, SM clock, L2 and DRAM bytes. Reads ncu's `--csv --page details`
output with the script's own `profiled: NAME` lines in it (one per launch, in launch order);
the L2 flush launched before each GEMM is profiled too and left out here.

    python3 benchmarks/ncu_cycles.py ncu_2048_rounds.csv
"""

from __future__ import annotations

import csv
import io
import statistics
import sys
from collections import defaultdict

METRICS = {  # column -> (ncu metric, scale)
    "duration us": ("gpu__time_duration.sum", 1e-3),
    "elapsed cycles": ("sm__cycles_elapsed.max", 1.0),
    "SM active cycles (avg)": ("sm__cycles_active.avg", 1.0),
    "SM clock GHz": ("smsp__cycles_elapsed.avg.per_second", 1e-9),
    "L2 MB": ("lts__t_bytes.sum", 1e-6),
    "DRAM MB": ("dram__bytes.sum", 1e-6),
}


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def summarize(text: str) -> str:
    names = [line.split("profiled: ", 1)[1].strip() for line in text.splitlines() if "profiled: " in line]
    table = text[text.index('"ID"'):]
    rows = list(csv.DictReader(io.StringIO("\n".join(
        line for line in table.splitlines() if line.startswith('"')))))
    flush_grid = rows[0]["Grid Size"]  # the first launch profiled is an L2 flush
    launches: dict[int, dict[str, str]] = defaultdict(dict)
    for r in rows:
        if r["Grid Size"] != flush_grid:
            launches[int(r["ID"])][r["Metric Name"]] = r["Metric Value"]
    gemms = [launches[i] for i in sorted(launches)]
    if len(gemms) != len(names):
        raise SystemExit(f"{len(gemms)} GEMM launches profiled, {len(names)} named")
    per_kernel: dict[str, list[dict[str, str]]] = defaultdict(list)
    for name, metrics in zip(names, gemms):
        per_kernel[name].append(metrics)
    lines = ["| kernel | rounds | " + " | ".join(f"{c} (median)" for c in METRICS) + " |",
             "|---|---|" + "---|" * len(METRICS)]
    for name, samples in per_kernel.items():
        cells = []
        for metric, scale in METRICS.values():
            values = [_number(s[metric]) * scale for s in samples if metric in s]
            cells.append(f"{statistics.median(values):,.3f}".rstrip("0").rstrip(".") if values else "-")
        lines.append(f"| {name} | {len(samples)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarize(open(sys.argv[1]).read()))
