"""Issue 25's table: per problem of fused-epilogue stores, the best kernel's speed relative to torch
eager and to torch.compile of the same math, median over the confirm passes with their range.

    python3 benchmarks/epilogue_table.py STORE [STORE ...] > table.md

Each confirm pass holds, per problem, the eager baseline row (torch eager with torch.compile timed
in its sampling loop: `compile_ratio`) and the candidates paired with eager (`paired_ratio`); the
ratio to torch.compile of a pass is `paired_ratio / compile_ratio` (`Measurement.to_compile`). A
problem no confirm pass reached shows its sweep's best paired ratio and the last baseline row
("sweep" in the passes column). Geomeans follow per epilogue; the goals of issue 25 are checked
below them (bias+activation: eager >= 1.10 and torch.compile >= 1.00 as geomeans; fp8 rowcol:
>= 1.00 against torch._scaled_mm at every shape with M >= 1024).
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import defaultdict

from cutlass_tune.measurement import Measurement
from cutlass_tune.status import Status
from cutlass_tune.store import CONFIRM_STUDY, ResultStore


def _figures(store: ResultStore) -> dict[str, dict]:
    """problem name -> {problem, kernel, eager: [ratio per pass], compile: [...], passes}."""
    rows = store.rows(["study", "run_id"])
    measurements = store.measurements()
    confirm: dict[str, dict[tuple[str, int], list[tuple[Measurement, Measurement | None]]]] = defaultdict(
        lambda: defaultdict(list))
    sweep_best: dict[str, tuple[float, Measurement]] = {}
    last_base: dict[str, Measurement] = {}
    base_of_pass: dict[tuple[str, str, int], Measurement] = {}
    for row, m in zip(rows, measurements):
        name = m.problem.name
        if m.is_baseline:
            if m.status is Status.OK:
                last_base[name] = m
                base_of_pass[(row.run_id, name, m.repeat)] = m
            continue
        if m.config is None or m.status is not Status.OK or m.paired_ratio is None:
            continue
        if row.study == CONFIRM_STUDY:
            base = base_of_pass.get((row.run_id, name, m.repeat))
            confirm[name][(m.kernel_name + " " + m.runtime.name, m.repeat)].append((m, base))
        elif name not in sweep_best or m.paired_ratio > sweep_best[name][0]:
            sweep_best[name] = (m.paired_ratio, m)
    out = {}
    for name in set(sweep_best) | set(confirm):
        by_kernel: dict[str, list[tuple[Measurement, Measurement | None]]] = defaultdict(list)
        for (kernel, _rep), got in confirm.get(name, {}).items():
            by_kernel[kernel].extend(got)
        if by_kernel:  # the confirmed candidate with the best median ratio to eager
            kernel, got = max(by_kernel.items(), key=lambda kv: statistics.median(m.paired_ratio for m, _ in kv[1]))
            eager = [m.paired_ratio for m, _ in got]
            compiled = [r for m, b in got if b is not None and (r := b.to_compile(m.paired_ratio)) is not None]
            out[name] = dict(problem=got[0][0].problem, kernel=kernel, eager=eager, compile=compiled,
                             passes=str(len(got)))
        else:
            ratio, m = sweep_best[name]
            base = last_base.get(name)
            compiled = [] if base is None or base.to_compile(ratio) is None else [base.to_compile(ratio)]
            out[name] = dict(problem=m.problem, kernel=m.kernel_name + " " + m.runtime.name, eager=[ratio],
                             compile=compiled, passes="sweep")
    return out


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def main(urls: list[str]) -> int:
    figures: dict[str, dict] = {}
    for url in urls:
        figures.update(_figures(ResultStore(url)))
    if not figures:
        print("no kernel measured OK in these stores yet")
        return 1
    print("| shape (MxNxK) | types | epilogue | to torch eager | to torch.compile | passes | kernel |")
    print("|---|---|---|---|---|---|---|")
    groups: dict[str, list[dict]] = defaultdict(list)
    for f in sorted(figures.values(), key=lambda f: (f["problem"].epilogue.name, f["problem"].scaling.value,
                                                      f["problem"].n, f["problem"].k, f["problem"].m)):
        p = f["problem"]
        operation = p.epilogue.name + ("" if p.scaling.value == "none" else f", scale {p.scaling.value}")
        groups[operation].append(f)
        print(f"| {p.m}x{p.n}x{p.k} | {p.dtype_a.value}->{p.dtype_d.value} | {operation} | {_cell(f['eager'])} "
              f"| {_cell(f['compile'])} | {f['passes']} | {f['kernel']} |")
    print()
    for operation, fs in groups.items():
        eager = _geomean([statistics.median(f["eager"]) for f in fs])
        compiled = _geomean([statistics.median(f["compile"]) for f in fs if f["compile"]])
        line = f"{operation}: geomean over {len(fs)} shapes, to eager {eager:.3f}"
        line += f", to torch.compile {compiled:.3f}" if compiled is not None else ", to torch.compile -"
        if "scale" in operation:
            low = [f for f in fs if f["problem"].m >= 1024 and statistics.median(f["eager"]) < 1.0]
            line += f"; goal (>= 1.00 at every M >= 1024): {'met' if not low else f'missed at {len(low)}'}"
        else:
            met = eager is not None and eager >= 1.10 and compiled is not None and compiled >= 1.00
            line += f"; goal (eager >= 1.10, torch.compile >= 1.00): {'met' if met else 'missed'}"
        print(line)
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print("usage: epilogue_table.py STORE [STORE ...]", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1:]))
