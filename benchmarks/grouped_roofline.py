"""How far each grouped kernel of a swept store is from what the GPU allows for its problem.

    python3 benchmarks/grouped_roofline.py STORE [--bandwidth-tbs 4.8] [--table best.csv] [--tile-m 64]

For each grouped problem of STORE (a store URL, a .sqlite file or a gzipped one) and the kernel
the table names for it (`--table`, a best-table CSV; default: the store's fastest ok kernel), in
one timing method (sustained where both the kernel and torch's baseline have a sustained row,
else events), a floor on the kernel's time from two bounds:

- memory: every operand read or written once (the E expert weights, A, D) at `--bandwidth-tbs`
  (the H200 datasheet's 4.8 TB/s by default: no kernel moves more);
- compute: the FLOPs the kernel's tiles execute (each expert's rows rounded up to the tile's M,
  so a skewed routing's part-empty tiles count) at the rate of the dense GEMM of the same FLOPs,
  measured beside torch's grouped GEMM in the same run (the baseline's `dense` side). With
  `--tile-m`, the rows are rounded up to that tile's M instead (64, the smallest SM90 tile:
  what any kernel could reach, granting it the dense rate).

The floor is the larger of the two. Printed per problem: rows per expert, the tile's use of its
M, both bounds, the floor, the kernel's and torch's time, the kernel's share of its floor, the
floor as a share of the dense rate (the most of the dense rate a grouped kernel with that tile
can reach), and the bytes per second the kernel moved. Then the geomean of torch's time over the
floor (the ratio to torch a kernel at its floor would reach). Needs no GPU.
"""

from __future__ import annotations

import argparse
import gzip
import math
import shutil
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import pandas as pd

from cutlass_tune.store import ResultStore, open_store


def _store(source: str, scratch: Path) -> ResultStore:
    """The store `source` names (`open_store`'s URL or SQLite file), a gzipped file unpacked into
    `scratch` first."""
    path = Path(source)
    if "://" not in source and path.suffix == ".gz":
        plain = scratch / path.stem
        with gzip.open(path, "rb") as src, plain.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        source = str(plain)
    return open_store(source)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def roofline(measurements: list, table: pd.DataFrame | None, bandwidth: float, tile_m: int | None = None) -> list[dict]:
    """One dict per grouped problem (see the module docstring)."""
    kernels: dict[str, dict[tuple[str, str, str], list[float]]] = defaultdict(lambda: defaultdict(list))
    baselines: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    problems, tiles = {}, {}
    for m in measurements:
        p = m.problem
        if not p.grouped or m.status.value != "ok" or not m.median_ms:
            continue
        problems[p.name] = p
        if m.is_baseline:
            if m.dense_median_ms:
                baselines[p.name][m.method].append((m.median_ms, m.dense_median_ms))
        elif m.config is not None:
            kernels[p.name][(m.config.hash, m.runtime.name, m.method)].append(m.median_ms)
            tiles[m.config.hash] = m.config.tile_m
    chosen = {}
    if table is not None:
        for r in table.to_dict("records"):
            if r.get("grouping") == "grouped":
                chosen[r["problem"]] = (r["config_hash"], r["runtime"])
    out = []
    for name, p in sorted(problems.items(), key=lambda kv: (kv[1].m, kv[1].n, kv[1].k)):
        measured = kernels[name]
        if name in chosen:
            pick = chosen[name]
        else:
            fastest = min(measured.items(), key=lambda kv: _median(kv[1]), default=None)
            if fastest is None:
                continue
            pick = fastest[0][:2]
        method = "sustained" if (*pick, "sustained") in measured and baselines[name]["sustained"] else "events"
        times, sides = measured.get((*pick, method), []), baselines[name][method]
        if not times or not sides:
            continue
        ours = _median(times)
        torch_ms = _median([t for t, _ in sides])
        dense_ms = _median([d for _, d in sides])
        tile = tile_m or tiles[pick[0]]
        padded = sum(math.ceil(r / tile) * tile for r in p.group_rows)
        flops = 2 * p.m * p.n * p.k
        dense_rate = flops / (dense_ms * 1e-3)
        bytes_ = 2 * (p.groups * p.n * p.k + p.m * p.k + p.m * p.n)
        memory_ms = bytes_ / bandwidth * 1e3
        compute_ms = 2 * padded * p.n * p.k / dense_rate * 1e3
        floor_ms = max(memory_ms, compute_ms)
        out.append({
            "problem": name, "method": method, "rows_per_expert": p.m / p.groups, "tile_m": tile,
            "tile_use": p.m / padded, "memory_us": memory_ms * 1e3, "compute_us": compute_ms * 1e3,
            "floor_us": floor_ms * 1e3, "ours_us": ours * 1e3, "torch_us": torch_ms * 1e3,
            "ours_of_floor": floor_ms / ours, "floor_of_dense": dense_ms / floor_ms,
            "ours_of_dense": dense_ms / ours, "ours_tbs": bytes_ / (ours * 1e-3) / 1e12,
            "torch_over_floor": torch_ms / floor_ms, "torch_over_ours": torch_ms / ours,
        })
    return out


def render(rows: list[dict], bandwidth: float) -> str:
    head = (f"{'problem':<52} {'method':<9} {'rows/e':>6} {'tileM':>5} {'use':>5} {'mem us':>7} {'math us':>7} "
            f"{'floor':>7} {'ours':>7} {'torch':>7} {'ours/fl':>7} {'fl%dense':>8} {'ours%dense':>10} {'TB/s':>5}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['problem']:<52} {r['method']:<9} {r['rows_per_expert']:>6.0f} {r['tile_m']:>5} "
                     f"{r['tile_use']:>5.2f} {r['memory_us']:>7.1f} {r['compute_us']:>7.1f} {r['floor_us']:>7.1f} "
                     f"{r['ours_us']:>7.1f} {r['torch_us']:>7.1f} {r['ours_of_floor']:>7.2f} "
                     f"{r['floor_of_dense']:>8.2f} {r['ours_of_dense']:>10.2f} {r['ours_tbs']:>5.2f}")
    if rows:
        def geo(key: str) -> float:
            return math.exp(statistics.fmean(math.log(r[key]) for r in rows))

        lines += [f"bandwidth bound at {bandwidth / 1e12:.2f} TB/s; "
                  "floor = max(memory, tiles' FLOPs at the dense rate)",
                  f"geomean torch / ours {geo('torch_over_ours'):.3f}; torch / floor {geo('torch_over_floor'):.3f} "
                  f"(a kernel at its floor on every problem); ours / floor {geo('ours_of_floor'):.3f}"]
        fine = [r for r in rows if r["rows_per_expert"] <= 512]
        if fine:
            reach = sum(r["floor_of_dense"] >= 0.85 for r in fine)
            lines.append(f"<= 512 rows per expert: {len(fine)} problems, the floor reaches 85% of the dense rate "
                         f"on {reach}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store", help="store URL, .sqlite or .sqlite.gz file")
    parser.add_argument("--table", type=Path, help="best-table CSV naming each problem's kernel")
    parser.add_argument("--bandwidth-tbs", type=float, default=4.8)
    parser.add_argument("--tile-m", type=int, help="round each expert's rows up to this tile M (default: the kernel's)")
    args = parser.parse_args()
    bandwidth = args.bandwidth_tbs * 1e12
    with tempfile.TemporaryDirectory() as scratch:
        measurements = _store(args.store, Path(scratch)).measurements()
    table = pd.read_csv(args.table) if args.table else None
    print(render(roofline(measurements, table, bandwidth, args.tile_m), bandwidth))
    return 0


if __name__ == "__main__":
    sys.exit(main())
