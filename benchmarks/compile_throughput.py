"""Compile throughput: kernels per minute (and per core) with one or several kernels per unit.

Samples N valid configs of a search space (seeded, so runs compare), compiles them into a fresh
cache once per `--kernels-per-unit` value, and prints wall time, CPU time of nvcc and its
children, kernels/min and kernels/min/core, and every failure. Writes a JSON summary.

    python3 benchmarks/compile_throughput.py configs/sm90_bf16.yaml -n 32 --per-unit 1 4 -o out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import tempfile
import time
from pathlib import Path

from cutlass_tune.compile import KernelCache, compile_kernels, default_jobs, find_toolchain
from cutlass_tune.space import load_space
from cutlass_tune.status import Status


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("space")
    parser.add_argument("-n", type=int, default=32, help="configs to sample")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-unit", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("-o", "--output", type=Path, default=None)
    args = parser.parse_args()

    valid = list(load_space(args.space).valid)
    configs = random.Random(args.seed).sample(valid, min(args.n, len(valid)))
    toolchain = find_toolchain()
    jobs = args.jobs or default_jobs()
    cores = len(os.sched_getaffinity(0))
    runs = []
    for per_unit in args.per_unit:
        with tempfile.TemporaryDirectory() as cache_dir:
            cpu0, t0 = children_cpu_seconds(), time.monotonic()
            results = compile_kernels(configs, cache=KernelCache(Path(cache_dir)), toolchain=toolchain,
                                      jobs=jobs, kernels_per_unit=per_unit)
            wall, cpu = time.monotonic() - t0, children_cpu_seconds() - cpu0
        failed = [(r.config.name, r.status.value, r.reason) for r in results if r.status is not Status.OK]
        spills = [(r.config.name, r.reason) for r in results if r.status is Status.OK and r.reason]
        run = {
            "kernels_per_unit": per_unit, "kernels": len(configs), "jobs": jobs, "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1), "cpu_s_per_kernel": round(cpu / len(configs), 1),
            "kernels_per_min": round(len(configs) / wall * 60, 1),
            "kernels_per_min_per_core": round(len(configs) / wall * 60 / min(jobs, cores), 2),
            "failed": failed, "spills": spills,
        }
        runs.append(run)
        print(json.dumps({k: v for k, v in run.items() if k not in ("failed", "spills")}))
        for name, status, reason in failed:
            print(f"  FAILED {name}: {status}: {reason}")
        for name, reason in spills:
            print(f"  {name}: {reason}")
    summary = {
        "space": args.space, "seed": args.seed, "host": platform.node(), "cores": cores,
        "nvcc": toolchain.nvcc_version, "cutlass": toolchain.cutlass_version,
        "configs": [c.name for c in configs], "runs": runs,
    }
    if args.output:
        args.output.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
