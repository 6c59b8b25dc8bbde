"""What the end-to-end scripts (moe_model.py, fusion_model.py, model_e2e.py, grouped_call_site.py)
share: a block of calls timed by CUDA events, a block's host time with the GPU kept busy, and the
relative error of one output against another."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

BUSY_CYCLES = 200_000_000
"""`torch.cuda._sleep`'s cycles ahead of each host-time block: 100-140 ms at an H200's 1.4-2 GHz."""


def block_ms(fn: Callable[[], object], count: int) -> float:
    """Milliseconds per call of `count` back-to-back calls of `fn`, between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(count):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / count


def host_ms(fn: Callable[[], object], count: int, reps: int = 9, *, busy_cycles: int = BUSY_CYCLES,
            warm: int = 1) -> tuple[float, bool]:
    """Host milliseconds per call of `fn`, the GPU kept busy (a sleep kernel of `busy_cycles`
    enqueued ahead of each block of `count` calls, so the host only enqueues and never waits),
    after `warm` calls: the median of `reps` blocks, and whether a call waited on the GPU (a block
    as long as the sleep: a host sync in `fn`, whose figure is then the sleep's, not host time).
    Keep `count` calls' launches under the launch queue's depth (about a thousand), past which a
    launch waits too."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.cuda._sleep(busy_cycles)
    torch.cuda.synchronize()
    sleep_s = time.perf_counter() - start
    blocks = []
    for _ in range(reps):
        torch.cuda._sleep(busy_cycles)
        start = time.perf_counter()
        for _ in range(count):
            fn()
        blocks.append(time.perf_counter() - start)
        torch.cuda.synchronize()
    waited = max(blocks) > 0.8 * sleep_s
    return statistics.median(blocks) / count * 1e3, waited


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want||, in fp32."""
    want = want.float()
    return ((got.float() - want).norm() / want.norm().clamp_min(1e-30)).item()
