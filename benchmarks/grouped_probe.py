"""Grouped (MoE) GEMM probe: a fixed list of grouped CUTLASS kernels against torch._grouped_mm.

For each case of issue 33 (the experts' gate_up and down GEMMs of Qwen3-30B-A3B, DeepSeek-V3 at
TP8, OLMoE and Mixtral) with uniform and zipf routing, this measures the torch baseline row
(torch._grouped_mm, with the expert loop and the dense GEMM of the same FLOPs in its loop), then
every kernel of `CONFIGS` through the product's own harness (a `Worker` running `GpuRunner`: each
variant verified per expert against the fp32 reference, raced over the raster orders, paired
events timing against torch._grouped_mm), then confirms the best two (kernel, variant) of each
case by paired sustained timing.

    python3 benchmarks/grouped_probe.py OUT_DIR [--configs N] [--cases NAME,...] [--deadline-s S]

It resumes: OUT_DIR/measurements.jsonl keeps every measurement and OUT_DIR/done.txt every job
finished, and a rerun skips them (one GPU command may run 10 minutes; `--deadline-s` stops
starting jobs before that). It writes OUT_DIR/summary.csv and summary.json and prints the table
last: case, routing, torch._grouped_mm / loop / dense TFLOP/s, the best kernel, its TFLOP/s
and its ratio to torch._grouped_mm (events, and sustained where confirmed).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cutlass_tune.bench import Job, RaceOptions, TimingOptions, Worker
from cutlass_tune.compile import CompiledKernel, compile_kernels
from cutlass_tune.measurement import Baseline, Measurement, TimingMethod, read_jsonl, write_jsonl
from cutlass_tune.space import (
    EpilogueSchedule,
    Grouping,
    KernelConfig,
    KernelSchedule,
    Problem,
    RasterOrder,
    Routing,
    RuntimeArgs,
    check_config,
    check_runtime,
)
from cutlass_tune.status import Status


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    experts: int
    n: int
    k: int
    rows: int


CASES = (
    Case("qwen3-30b-a3b gate_up", 128, 1536, 2048, 32768),
    Case("qwen3-30b-a3b down", 128, 2048, 768, 32768),
    Case("deepseek-v3 tp8 gate_up", 256, 512, 7168, 32768),
    Case("qwen3-30b-a3b gate_up 4k", 128, 1536, 2048, 4096),
    Case("olmoe gate_up", 64, 2048, 2048, 65536),
    Case("mixtral gate_up", 8, 28672, 4096, 16384),
)
ROUTINGS = (Routing.UNIFORM, Routing.ZIPF)


def _config(tile: tuple[int, int, int], cluster: tuple[int, int], pingpong: bool) -> KernelConfig:
    return KernelConfig(grouping=Grouping.GROUPED, tile_m=tile[0], tile_n=tile[1], tile_k=tile[2],
                        cluster_m=cluster[0], cluster_n=cluster[1],
                        kernel_schedule=KernelSchedule.PINGPONG if pingpong else KernelSchedule.COOPERATIVE,
                        epilogue_schedule=EpilogueSchedule.TMA if pingpong else EpilogueSchedule.TMA_COOPERATIVE)


CONFIGS = (
    _config((128, 256, 64), (1, 1), pingpong=False),
    _config((128, 192, 64), (1, 1), pingpong=True),
    _config((128, 128, 64), (1, 1), pingpong=False),
    _config((256, 128, 64), (1, 1), pingpong=False),
    _config((128, 256, 64), (2, 1), pingpong=False),
    _config((128, 256, 64), (1, 2), pingpong=False),
    _config((256, 128, 64), (2, 1), pingpong=False),
    _config((128, 128, 64), (2, 1), pingpong=False),
    _config((128, 128, 64), (1, 1), pingpong=True),
    _config((64, 128, 64), (1, 1), pingpong=True),
    _config((64, 256, 64), (1, 1), pingpong=True),
    _config((128, 64, 64), (1, 1), pingpong=True),
)
"""Cooperative and ping-pong kernels, tiles 64 to 256, clusters 1x1, 2x1 and 1x2."""

VARIANTS = tuple(RuntimeArgs(raster=r) for r in RasterOrder)
"""Raster orders only: without host problem shapes the group scheduler ignores the swizzle."""
EVENTS = TimingOptions(paired=True)
SUSTAINED = TimingOptions(method=TimingMethod.SUSTAINED, paired=True)
BASELINE_TIMING = TimingOptions()
CONFIRMED = 2
"""(kernel, variant) pairs of each case confirmed by sustained timing."""


def problems(cases: tuple[Case, ...]) -> Iterator[tuple[Case, Problem]]:
    for case in cases:
        for routing in ROUTINGS:
            yield case, Problem.experts(case.experts, case.n, case.k, case.rows, routing=routing)


class Progress:
    """OUT_DIR's measurements and finished jobs; appends as it goes."""

    def __init__(self, out: Path):
        out.mkdir(parents=True, exist_ok=True)
        self.rows_path, self.done_path = out / "measurements.jsonl", out / "done.txt"
        self.rows = list(read_jsonl(self.rows_path)) if self.rows_path.exists() else []
        self.done = set(self.done_path.read_text().splitlines()) if self.done_path.exists() else set()

    def record(self, key: str, found: list[Measurement]) -> None:
        with open(self.rows_path, "a") as f:
            for m in found:
                write_jsonl(f, m)
        with open(self.done_path, "a") as f:
            f.write(key + "\n")
        self.rows += found
        self.done.add(key)

    def of(self, problem: Problem, method: TimingMethod) -> list[Measurement]:
        return [m for m in self.rows if m.problem == problem and m.method == method.value]


def best_kernels(rows: list[Measurement], count: int) -> list[Measurement]:
    """The `count` best OK kernel rows by paired ratio, one per (kernel, variant)."""
    timed = [m for m in rows if not m.is_baseline and m.status is Status.OK and m.paired_ratio]
    return sorted(timed, key=lambda m: m.paired_ratio or 0.0, reverse=True)[:count]


def run(out: Path, configs: tuple[KernelConfig, ...], cases: tuple[Case, ...], deadline_s: float) -> None:
    started = time.monotonic()
    progress = Progress(out)
    for cfg in configs:
        why = check_config(cfg)
        if why:
            print(f"skip {cfg.name}: {why[0]}", file=sys.stderr)
    valid = [c for c in configs if not check_config(c)]
    print(f"compiling {len(valid)} grouped kernels ...", file=sys.stderr)
    compiled = compile_kernels(valid)
    kernels: list[CompiledKernel] = []
    for k in compiled:
        if k.status is Status.OK:
            kernels.append(k)
        else:
            print(f"{k.config.name}: {k.status.value}: {k.reason[:200]} (log {k.log_path})", file=sys.stderr)

    def late() -> bool:
        return time.monotonic() - started > deadline_s

    with Worker(0, timeout_s=300) as worker:
        for _case, problem in problems(cases):
            base_key = f"{problem.name}|baseline"
            if base_key not in progress.done and not late():
                found = list(worker.run(Job.baseline(problem, timing=BASELINE_TIMING)))
                progress.record(base_key, found)
                print(f"{problem.name}: torch._grouped_mm {found[0].status.value} {found[0].reason[:120]}",
                      file=sys.stderr)
            for k in kernels:
                key = f"{problem.name}|{k.config.name}|events"
                if key in progress.done or late():
                    continue
                variants = tuple(v for v in VARIANTS if not check_runtime(k.config, v))
                best = best_kernels(progress.of(problem, TimingMethod.EVENTS), 1)
                job = Job.for_kernel(k, problem, variants, timing=EVENTS, race=RaceOptions(),
                                     bar=best[0].paired_ratio if best else None)
                progress.record(key, list(worker.run(job)))
            by_config = {k.config: k for k in kernels}
            for m in best_kernels(progress.of(problem, TimingMethod.EVENTS), CONFIRMED):
                key = f"{problem.name}|{m.kernel_name}|{m.runtime.name}|sustained"
                if key in progress.done or late() or m.config not in by_config:
                    continue
                job = Job.for_kernel(by_config[m.config], problem, (m.runtime,), timing=SUSTAINED)
                progress.record(key, list(worker.run(job)))
    if late():
        print(f"stopped after {deadline_s:.0f} s: run again to go on", file=sys.stderr)
    summarize(progress, cases, out)


def _tflops(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def summarize(progress: Progress, cases: tuple[Case, ...], out: Path) -> None:
    """summary.csv and summary.json, and the table printed last."""
    rows: list[dict[str, Any]] = []
    for case, problem in problems(cases):
        events = progress.of(problem, TimingMethod.EVENTS)
        base = next((m for m in events if m.is_baseline and m.status is Status.OK), None)
        best = best_kernels(events, 1)
        top = best[0] if best else None
        sustained = best_kernels(progress.of(problem, TimingMethod.SUSTAINED), 1)
        rows.append({
            "case": case.name, "routing": problem.routing.value, "problem": problem.name,
            "grouped_mm_tflops": base.tflops if base else None,
            "loop_tflops": base.side_tflops(Baseline.EXPERT_LOOP) if base else None,
            "dense_tflops": base.side_tflops(Baseline.DENSE) if base else None,
            "best_kernel": top.kernel_name if top else None,
            "best_variant": top.runtime.name if top else None,
            "best_tflops": top.tflops if top else None,
            "ratio_events": top.paired_ratio if top else None,
            "best_sustained_kernel": sustained[0].kernel_name if sustained else None,
            "ratio_sustained": sustained[0].paired_ratio if sustained else None,
            "kernels_measured": sum(1 for m in events if not m.is_baseline),
            "kernels_failed": sum(1 for m in events if not m.is_baseline
                                  and m.status not in (Status.OK, Status.COARSE, Status.UNSTABLE)),
        })
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "summary.json").write_text(json.dumps(rows, indent=1))
    header = ("case", "routing", "torch._grouped_mm", "loop", "dense", "best config", "TFLOP/s",
              "ratio (events)", "ratio (sustained)")
    lines = [header] + [(r["case"], r["routing"], _tflops(r["grouped_mm_tflops"]), _tflops(r["loop_tflops"]),
                         _tflops(r["dense_tflops"]), f"{r['best_kernel'] or '-'} {r['best_variant'] or ''}".strip(),
                         _tflops(r["best_tflops"]), _ratio(r["ratio_events"]), _ratio(r["ratio_sustained"]))
                        for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--configs", type=int, default=len(CONFIGS), help="measure the first N kernels")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--deadline-s", type=float, default=540.0, help="start no job after this many seconds")
    args = parser.parse_args()
    cases: tuple[Case, ...] = CASES
    if args.cases:
        wanted = {c.strip() for c in args.cases.split(",")}
        unknown = wanted - {c.name for c in CASES}
        if unknown:
            parser.error(f"unknown case {sorted(unknown)[0]!r}: use one of {', '.join(c.name for c in CASES)}")
        cases = tuple(c for c in CASES if c.name in wanted)
    if not 1 <= args.configs <= len(CONFIGS):
        parser.error(f"--configs takes 1 to {len(CONFIGS)}")
    run(args.out_dir, CONFIGS[:args.configs], cases, args.deadline_s)


if __name__ == "__main__":
    main()
