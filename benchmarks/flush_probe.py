"""Where cuBLAS's lead at 2048^3 comes from: the best kernels there (`ncu_profile.KERNELS`)
paired with cuBLAS under four ways of timing (device only; three passes each):

- ``dirty``: the standard, a write of twice the L2 size before each launch (`L2Flush`), which
  leaves L2 full of modified lines that the GEMM's reads must write back;
- ``clean``: a read of twice the L2 size instead, which leaves L2 full of unmodified lines;
- ``warm``: no flush, single launches between events (the operands stay in L2);
- ``graph``: CUDA-graph replays (L2 warm, no per-launch host path).

Each kernel's output is checked against an fp32 reference before it is timed.

    python3 benchmarks/flush_probe.py [SIZE]
"""

from __future__ import annotations

import sys

import torch
from ncu_profile import build_launches

from cutlass_tune.bench._timing import L2Flush, TimingOptions, time_paired
from cutlass_tune.bench._verify import reference, verify_launch
from cutlass_tune.status import Status

PASSES = 3


class ReadFlush:
    """Reads a buffer of twice the L2 size: evicts the operands, leaves no modified lines."""

    def __init__(self, nbytes: int):
        self._buffer = torch.ones(nbytes // 4, dtype=torch.int32, device="cuda:0")
        self._sink = torch.empty((), dtype=torch.int64, device="cuda:0")

    def __call__(self) -> None:
        torch.sum(self._buffer, dim=0, out=self._sink)


def main(size: int) -> None:
    ops, launches = build_launches(size)
    ref = reference(ops)
    *kernels, (_, cublas) = launches
    dirty = L2Flush(0, torch.cuda.get_device_properties(0).L2_cache_size)
    methods = {"dirty": (dirty, False), "clean": (ReadFlush(dirty.nbytes), False),
               "warm": (None, False), "graph": (None, True)}
    print(f"{torch.cuda.get_device_name(0)}, {size}^3 bf16 TN, ratio to cuBLAS paired (median of "
          f"samples; {PASSES} passes)")
    print("| kernel | " + " | ".join(methods) + " |")
    print("|---|" + "---|" * len(methods))
    for name, launch in kernels:
        verdict = verify_launch(launch, ops, ref)
        if verdict.status is not Status.OK:
            print(f"| {name} | {verdict.status.value}: {verdict.reason} |")
            continue
        cells = []
        for flush, graph in methods.values():
            ratios = []
            for _ in range(PASSES):
                ours, theirs = time_paired(launch, cublas, options=TimingOptions(graph=graph, paired=True),
                                           flush=flush)
                ratios.append(theirs.median_ms / ours.median_ms)
            cells.append(" / ".join(f"{r:.3f}" for r in ratios))
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2048)
