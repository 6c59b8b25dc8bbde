"""Where the wall time of one measurement goes, on the GPU host.

`cutlass-tune confirm` took about 2.2 s per kernel measurement on an H200 whatever the size
(1000 samples at 1024^3, 35 at 8192^3) and 0.2 s per cuBLAS baseline, before the worker fix of
benchmarks/worker_restarts.md, which this script's figures led to. This script measures
one sourceless 64x128 plain kernel and cuBLAS at 1024^3 and 8192^3, paired as confirm does:
the wall time of each job in this process (no worker) and through the worker, then a cProfile
of one kernel job in this process.

    python3 benchmarks/profile_measurement.py
"""

import cProfile
import dataclasses
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cutlass_tune.bench import GpuRunner, Job, TimingOptions, WorkerBenchmarker  # noqa: E402
from cutlass_tune.compile import compile_kernels  # noqa: E402
from cutlass_tune.space import RuntimeArgs, load_space  # noqa: E402


def main() -> None:
    space = load_space("configs/winners_nosrc_bf16.yaml")
    config = space.valid[0]
    problems = [p for p in space.problems if p.m in (1024, 8192)]
    (kernel,) = compile_kernels([config])
    print(config.name, kernel.status.value, f"compile {kernel.seconds:.1f} s")
    timing = TimingOptions(paired=True)
    variant = (RuntimeArgs(),)
    runner = GpuRunner(0)

    def wall(job: Job) -> float:
        start = time.perf_counter()
        for _ in runner(job):
            pass
        return time.perf_counter() - start

    for p in problems:
        base = [wall(Job.baseline(p, timing=timing)) for _ in range(3)]
        kern = [wall(Job.for_kernel(kernel, p, variant, timing=timing)) for _ in range(3)]
        plain = [wall(Job.for_kernel(kernel, p, variant, timing=dataclasses.replace(timing, paired=False)))
                 for _ in range(3)]
        print(f"in process, {p.name}: baseline {base}, kernel paired {kern}, kernel alone {plain}")
    bench = WorkerBenchmarker(0, timing=timing)
    try:
        for p in problems:
            times = []
            for _ in range(3):
                start = time.perf_counter()
                list(bench.measure(kernel, p, variant))
                times.append(time.perf_counter() - start)
            print(f"through the worker, {p.name}: kernel paired {times}")
    finally:
        bench.close()
    profile = cProfile.Profile()
    profile.enable()
    for _ in runner(Job.for_kernel(kernel, problems[0], variant, timing=timing)):
        pass
    profile.disable()
    pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
    pstats.Stats(profile).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
