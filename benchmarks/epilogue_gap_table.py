"""The epilogue gap's tables (benchmarks/epilogue_gap.md) from one store of
`benchmarks/gpu_epilogue_gap.sh`: per shape and epilogue, the best kernel's ratio to each torch
path of the same math (eager, torch.compile, cuBLASLt's epilogue) and to the strongest, from the
best-config table (the confirmed passes where confirmed); then the knobs the prediction names,
from the sweep's paired events figures: per epilogue, each config's geomean ratio to eager over
the shapes relative to the cooperative 128x256 reference, and the activation's cost on each config
(its time over the same config's bias+relu time).

    python3 benchmarks/epilogue_gap_table.py STORE [--csv OUT.csv]
"""

from __future__ import annotations

import argparse
import collections
import math
import statistics
import sys

from cutlass_tune import load_best
from cutlass_tune.measurement import Measurement
from cutlass_tune.space import AUTO_EPILOGUE_TILE, AUTO_STAGES
from cutlass_tune.status import Status
from cutlass_tune.store import CONFIRM_STUDY, open_store

REFERENCE = "128x256 coop 2x1"


def label(m: Measurement) -> str:
    """A config in the words of the prediction: tile, schedule, cluster and the knobs it varies."""
    c = m.config
    assert c is not None, "a kernel's row has its config"
    sched = {"cooperative": "coop", "pingpong": "pingpong"}.get(c.kernel_schedule.value, c.kernel_schedule.value)
    out = f"{c.tile_m}x{c.tile_n} {sched} {c.cluster_m}x{c.cluster_n}"
    if c.epilogue_tile_n != AUTO_EPILOGUE_TILE:
        out += f" e{c.epilogue_tile_n}"
    if c.epilogue_source is False:
        out += " nosrc"
    if c.stages != AUTO_STAGES:
        out += f" {c.stages} stages"
    return out


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else math.nan


def _fmt(v: float) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def best_table(store_url: str) -> list[str]:
    frame = load_best(store_url)
    lines = ["| shape (MxNxK) | epilogue | to eager | to torch.compile | to cuBLASLt | to the strongest | strongest "
             "| passes | kernel |", "|---|---|---|---|---|---|---|---|---|"]
    by_epilogue: dict[str, list[float]] = collections.defaultdict(list)
    for r in frame.sort_values(["epilogue", "m", "n", "k"]).itertuples():
        lines.append(f"| {r.m}x{r.n}x{r.k} | {r.epilogue} | {_fmt(r.ratio)} | {_fmt(r.torch_compile_ratio)} | "
                     f"{_fmt(r.cublaslt_ratio)} | {_fmt(r.strongest_ratio)} | {r.strongest} | {r.confirm_passes} | "
                     f"{r.kernel} {r.runtime} |")
        if not math.isnan(r.strongest_ratio):
            by_epilogue[r.epilogue].append(r.strongest_ratio)
    lines.append("")
    for epilogue, ratios in sorted(by_epilogue.items()):
        below = sum(v < 1.0 for v in ratios)
        lines.append(f"{epilogue}: geomean to the strongest torch path over {len(ratios)} shapes "
                     f"{geomean(ratios):.3f}, "
                     f"min {min(ratios):.3f}, below 1.00 at {below}; goal (geomean >= 1.15, none below 1.00): "
                     f"{'met' if geomean(ratios) >= 1.15 and not below else 'missed'}")
    return lines


def knob_tables(store_url: str) -> list[str]:
    """From the sweep's rows (events, paired with eager): each config's best variant per problem."""
    store = open_store(store_url)
    rows = store.rows(["study", "ratio", "status", "problem"])
    best: dict[tuple[str, str, str], float] = {}  # (epilogue, problem, config label) -> best ratio to eager
    times: dict[tuple[str, str, str], float] = {}  # the same -> its median ms at that ratio
    shapes: dict[str, str] = {}
    for row, m in zip(rows, store.measurements()):
        if m.is_baseline or m.config is None or row.study == CONFIRM_STUDY or m.status is not Status.OK:
            continue
        if not row.ratio or not m.median_ms:
            continue
        key = (m.problem.epilogue.name, f"{m.problem.m}x{m.problem.n}x{m.problem.k}", label(m))
        shapes[key[1]] = key[1]
        if key not in best or row.ratio > best[key]:
            best[key], times[key] = row.ratio, m.median_ms
    lines = []
    epilogues = sorted({k[0] for k in best})
    labels = sorted({k[2] for k in best})
    for epilogue in epilogues:
        lines += ["", f"### {epilogue}: sweep (events, paired with eager), geomean over shapes", "",
                  "| config | geomean ratio to eager | relative to " + REFERENCE + " | shapes |", "|---|---|---|---|"]
        for lab in labels:
            pairs = [(best[(epilogue, s, lab)], best.get((epilogue, s, REFERENCE))) for s in shapes
                     if (epilogue, s, lab) in best]
            rel = [a / b for a, b in pairs if b]
            lines.append(f"| {lab} | {_fmt(geomean([a for a, _ in pairs]))} | {_fmt(geomean(rel))} | {len(pairs)} |")
    lines += ["", "### The activation's cost: time over the same config's bias+relu time, geomean over shapes", "",
              "| config | bias+gelu_tanh / bias+relu | bias+gelu / bias+relu |", "|---|---|---|"]
    for lab in labels:
        cells = []
        for epilogue in ("bias+gelu_tanh", "bias+gelu"):
            rel = [times[(epilogue, s, lab)] / times[("bias+relu", s, lab)] for s in shapes
                   if (epilogue, s, lab) in times and ("bias+relu", s, lab) in times]
            cells.append(_fmt(geomean(rel)))
        lines.append(f"| {lab} | {cells[0]} | {cells[1]} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", help="the store of benchmarks/gpu_epilogue_gap.sh (URL or .sqlite file)")
    args = parser.parse_args(argv)
    url = args.store if "://" in args.store else f"sqlite:///{args.store}"
    print("\n".join(knob_tables(url)))
    print()
    print("\n".join(best_table(url)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
