"""How finely do L2-cold CUDA-event samples resolve a GEMM's time? (device only)

Times torch.matmul (bf16 TN) at a few square sizes with the project's own sampling
(`_time_interleaved` after an L2 flush), many samples each, and prints the distinct sample values,
the smallest step between them, median, mean and spread. Usage on a GPU host:

    python3 benchmarks/timer_resolution.py [SAMPLES]
"""

from __future__ import annotations

import statistics
import sys

import torch

from cutlass_tune.bench._env import env_stamp
from cutlass_tune.bench._timing import L2Flush, _time_interleaved, _Timed


def main() -> None:
    samples = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    env = env_stamp(0)
    flush = L2Flush(0, env.l2_bytes)
    print(f"{env.gpu}, torch {torch.__version__}, {samples} samples per size")
    for size in (512, 1024, 2048, 4096):
        a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        d = torch.empty(size, size, device="cuda", dtype=torch.bfloat16)
        for _ in range(20):
            torch.matmul(a, b.t(), out=d)
        def mm() -> None:
            torch.matmul(a, b.t(), out=d)

        ms = _time_interleaved(samples, [_Timed(mm, mm, None)], flush)[0][0]
        us = sorted(x * 1e3 for x in ms)
        distinct = sorted(set(round(x, 4) for x in us))
        steps = [b - a for a, b in zip(distinct, distinct[1:]) if b - a > 1e-4]
        counts = {v: sum(1 for x in us if round(x, 4) == v) for v in distinct}
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:6]
        print(f"{size}^3: median {statistics.median(us):.3f} us, mean {statistics.fmean(us):.3f} us, "
              f"p20 {us[len(us) // 5]:.3f}, p80 {us[4 * len(us) // 5]:.3f}, {len(distinct)} distinct values, "
              f"smallest step {min(steps) if steps else 0:.4f} us; most common: "
              + ", ".join(f"{v:.3f} x{c}" for v, c in top))


if __name__ == "__main__":
    main()
