"""Each timing method's ratio per shape, and what the caller gets through `matmul`.

    python3 benchmarks/methods.py bench TABLE OUT_DIR [--runs 2]   # events, graph, sustained per entry
    python3 benchmarks/methods.py check TABLE OUT_DIR [--tag after] # `check_table`: claimed vs delivered

`bench` compiles the table's kernels (in parallel, into the kernel cache), then measures each
entry's kernel and run-time variant on its problem by each method, paired with cuBLAS, in one
benchmark worker, `--runs` times; it writes every `Measurement` to methods.jsonl. `check` runs
the call-site check and writes check-TAG.jsonl. benchmarks/sustained.md reads both.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from cutlass_tune.bench import Job, TimingOptions, Worker, check_table
from cutlass_tune.bench._check import problem_of_row
from cutlass_tune.compile import KernelCache, compile_kernels, default_jobs
from cutlass_tune.measurement import TimingMethod, write_jsonl
from cutlass_tune.runtime import BestTable
from cutlass_tune.space import KernelConfig, RuntimeArgs

BUDGETS = {
    TimingMethod.EVENTS: TimingOptions(method=TimingMethod.EVENTS, paired=True),
    TimingMethod.GRAPH: TimingOptions(method=TimingMethod.GRAPH, paired=True),
    TimingMethod.SUSTAINED: TimingOptions(method=TimingMethod.SUSTAINED, paired=True, budget_ms=2000),
}


def bench(table: BestTable, out: Path, runs: int) -> None:
    rows = table.frame.to_dict("records")
    configs = [KernelConfig.from_dict(json.loads(r["config"])) for r in rows]
    started = time.time()
    built = {k.config.hash: k for k in compile_kernels(list({c.hash: c for c in configs}.values()),
                                                        cache=KernelCache.at(None), jobs=default_jobs())}
    print(f"compiled {len(built)} kernels in {time.time() - started:.0f} s", flush=True)
    with Worker(0) as worker, open(out / "methods.jsonl", "a") as sink:
        worker.start()
        for run in range(runs):
            for row, config in zip(rows, configs):
                problem, runtime = problem_of_row(row), RuntimeArgs.from_dict(_runtime(row))
                for method, options in BUDGETS.items():
                    job = Job.for_kernel(built[config.hash], problem, (runtime,), timing=options, repeat=run)
                    for m in worker.run(job):
                        write_jsonl(sink, m)
                        print(f"run {run} {problem.name} {method.value}: {m.status.value} "
                              f"ratio {m.paired_ratio} energy {m.energy_mj} / {m.baseline_energy_mj} mJ "
                              f"sm {m.sm_mhz} MHz", flush=True)


def _runtime(row: dict) -> dict:
    return {name: row[name] for name in ("raster", "swizzle", "splits", "decomposition") if name in row}


def check(table: BestTable, out: Path, tag: str) -> None:
    with open(out / f"check-{tag}.jsonl", "w") as sink:
        for c in check_table(table, options=TimingOptions(budget_ms=1600, min_samples=8)):
            sink.write(json.dumps(c.to_dict()) + "\n")
            sink.flush()
            shown = " ".join(f"{d.mode} {d.ratio:.3f}" for d in c.delivered)
            print(f"{tag} {c.problem.name}: claimed {c.claimed} {shown} {c.error}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=("bench", "check"))
    parser.add_argument("table")
    parser.add_argument("out", type=Path)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--tag", default="after")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    table = BestTable.load(args.table)
    if args.phase == "bench":
        bench(table, args.out, args.runs)
    else:
        check(table, args.out, args.tag)


if __name__ == "__main__":
    main()
