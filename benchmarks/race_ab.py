"""GPU seconds per (kernel, problem) with and without racing the run-time variants, and whether
the problem's winner changes: benchmarks/racing.md's figures.

Takes KERNELS configs measured in a sweep store (the best QUARTER by ratio, the rest spread over
the others, so that the race sees leaders and laggards as a sweep does), compiles them (cache
hits after the sweep), and measures each on every problem of the store twice in one worker: all
variants at the full budget ("full"), and raced (bench/_race.py) against the best full ratio the
raced arm has found so far on the problem, as a sweep does. The arms alternate which goes first
from kernel to kernel. Wall seconds of each job are taken around the worker's reply, so they hold
everything the worker does per job (operands, reference, verification, timing).

    python3 benchmarks/race_ab.py STORE OUT.json [KERNELS]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from cutlass_tune.bench import Job, RaceOptions, TimingOptions, Worker
from cutlass_tune.compile import KernelCache, compile_kernels
from cutlass_tune.measurement import Measurement
from cutlass_tune.space import KernelConfig, load_space
from cutlass_tune.status import Status
from cutlass_tune.store import ResultStore

QUARTER = 0.25


def pick(store: ResultStore, count: int) -> list[KernelConfig]:
    """`count` configs of the store: the best by ratio, then evenly over the rest."""
    best: dict[str, float] = {}
    configs: dict[str, KernelConfig] = {}
    for row, m in zip(store.rows(["config_hash", "status", "ratio"]), store.measurements()):
        if row.config_hash and row.status in (Status.OK, Status.COARSE) and row.ratio and m.config is not None:
            best[row.config_hash] = max(best.get(row.config_hash, 0.0), row.ratio)
            configs[row.config_hash] = m.config
    ranked = sorted(best, key=best.__getitem__, reverse=True)
    top = max(1, int(count * QUARTER))
    rest = ranked[top:]
    step = max(1, len(rest) // max(1, count - top))
    return [configs[h] for h in ranked[:top] + rest[::step][: count - top]]


def main() -> None:
    store_url, out = sys.argv[1], Path(sys.argv[2])
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    store = ResultStore(store_url if "://" in store_url else f"sqlite:///{store_url}")
    problems = sorted({m.problem for m in store.measurements() if not m.is_baseline}, key=lambda p: p.name)
    chosen = pick(store, count)
    space = load_space("configs/auto_bf16.yaml")
    kernels = [k for k in compile_kernels(chosen, cache=KernelCache.at(None)) if k.status is Status.OK]
    timing = TimingOptions(paired=True)
    race = RaceOptions()
    worker = Worker(0)
    worker.start()
    jobs: list[dict] = []
    bars: dict[str, float] = {}
    best: dict[tuple[str, str], tuple[float, str]] = {}
    try:
        for i, kernel in enumerate(kernels):
            variants = space.runtime_variants(kernel.config)
            for problem in problems:
                arms = ["full", "race"] if i % 2 == 0 else ["race", "full"]
                for arm in arms:
                    raced = arm == "race"
                    job = Job.for_kernel(kernel, problem, variants, timing=timing, race=race if raced else None,
                                         bar=bars.get(problem.name) if raced else None)
                    start = time.perf_counter()
                    found: list[Measurement] = list(worker.run(job))
                    seconds = time.perf_counter() - start
                    full = [m for m in found if m.status is Status.OK and m.paired_ratio]
                    for m in full:
                        key = (arm, problem.name)
                        ratio = m.paired_ratio
                        assert ratio is not None
                        if ratio > best.get(key, (0.0, ""))[0]:
                            best[key] = (ratio, f"{kernel.config.name} {m.runtime.name}")
                        if raced:
                            bars[problem.name] = max(bars.get(problem.name, 0.0), ratio)
                    jobs.append(dict(arm=arm, kernel=kernel.config.name, problem=problem.name, seconds=seconds,
                                     variants=len(variants), full=len(full),
                                     coarse=sum(m.status is Status.COARSE for m in found),
                                     failed=sum(m.status not in (Status.OK, Status.COARSE) for m in found)))
                    print(f"{arm:4} {problem.name} {kernel.config.name}: {seconds:.2f} s, {len(full)} full "
                          f"of {len(variants)}", flush=True)
    finally:
        worker.close()
    summary = {}
    for arm in ("full", "race"):
        secs = [j["seconds"] for j in jobs if j["arm"] == arm]
        summary[arm] = dict(jobs=len(secs), total_s=sum(secs), median_s=statistics.median(secs) if secs else None)
    winners = []
    for problem in problems:
        f, r = best.get(("full", problem.name)), best.get(("race", problem.name))
        winners.append(dict(problem=problem.name, full=f, race=r, same=bool(f and r and f[1] == r[1])))
    result = dict(gpu=worker.env.gpu if worker.env else None, kernels=len(kernels), problems=len(problems),
                  summary=summary, winners=winners, jobs=jobs)
    out.write_text(json.dumps(result, indent=1))
    full_s, race_s = summary["full"]["total_s"], summary["race"]["total_s"]
    print(f"GPU seconds per kernel-problem: full {full_s / max(1, summary['full']['jobs']):.2f}, raced "
          f"{race_s / max(1, summary['race']['jobs']):.2f} ({full_s / race_s:.2f}x fewer)")
    for w in winners:
        print(f"{w['problem']}: full {w['full']}, raced {w['race']}, same {w['same']}")


if __name__ == "__main__":
    main()
