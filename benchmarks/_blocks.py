"""What the end-to-end scripts (moe_model.py, fusion_model.py, model_e2e.py, grouped_call_site.py)
share: a block of calls timed by CUDA events, and the relative error of one output against another."""

from __future__ import annotations

from collections.abc import Callable

import torch


def block_ms(fn: Callable[[], object], count: int) -> float:
    """Milliseconds per call of `count` back-to-back calls of `fn`, between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(count):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / count


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want||, in fp32."""
    want = want.float()
    return ((got.float() - want).norm() / want.norm().clamp_min(1e-30)).item()
