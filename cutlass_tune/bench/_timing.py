"""Timing one launch on the GPU: the same function times every candidate and the baseline.

Two methods, named in `Measurement.method`:

- ``events`` (default): each sample is one launch between two CUDA events, preceded (outside
  the events) by a write of a buffer twice the size of L2, so every launch starts L2-cold.
- ``graph``: `reps` launches captured in one CUDA graph, each replay between two events, the
  sample being replay time / reps. L2 stays warm and launch overhead disappears; it suits
  problems so small that the host launch path would dominate.

Only ratios measured with the same method in the same run compare (see the facts file).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import torch

ESTIMATE_LAUNCHES = 5
GRAPH_REPLAY_MS = 1.0
"""Target duration of one graph replay; short kernels are repeated inside it."""
MAX_GRAPH_LAUNCHES = 100
MIN_FLUSH_BYTES = 32 << 20

Launch = Callable[[], None]


@dataclasses.dataclass(frozen=True)
class TimingOptions:
    """How long and how to measure one (kernel, problem, run-time variant).

    Attributes:
        budget_ms: GPU time to spend on samples; the sample count follows from an estimate.
        min_samples, max_samples: bounds on the sample count.
        warmup_ms: GPU time of untimed launches before sampling.
        graph: time CUDA-graph replays (warm L2) instead of single L2-cold launches.
    """

    budget_ms: float = 100.0
    min_samples: int = 10
    max_samples: int = 1000
    warmup_ms: float = 25.0
    graph: bool = False

    def __post_init__(self) -> None:
        if self.budget_ms <= 0 or self.warmup_ms < 0:
            raise ValueError("budget_ms must be positive and warmup_ms not negative")
        if not 1 <= self.min_samples <= self.max_samples:
            raise ValueError("need 1 <= min_samples <= max_samples")

    @property
    def method(self) -> str:
        return "graph" if self.graph else "events"


@dataclasses.dataclass(frozen=True)
class TimingStats:
    median_ms: float
    p20_ms: float
    p80_ms: float
    samples: int


def percentile(ordered: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of already sorted values; q in [0, 1]."""
    if not ordered:
        raise ValueError("no samples")
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(samples_ms: Sequence[float]) -> TimingStats:
    """Median, 20th and 80th percentile of per-launch times. Raises ValueError when empty."""
    ordered = sorted(samples_ms)
    return TimingStats(
        median_ms=percentile(ordered, 0.5),
        p20_ms=percentile(ordered, 0.2),
        p80_ms=percentile(ordered, 0.8),
        samples=len(ordered),
    )


def sample_count(estimate_ms: float, options: TimingOptions) -> int:
    """Samples that fill `options.budget_ms` at `estimate_ms` each, within the bounds."""
    wanted = math.ceil(options.budget_ms / max(estimate_ms, 1e-6))
    return max(options.min_samples, min(options.max_samples, wanted))


class L2Flush:
    """Writes a buffer of at least twice the L2 size, evicting whatever a launch left there."""

    def __init__(self, device: torch.device | int, l2_bytes: int):
        self.nbytes = max(2 * l2_bytes, MIN_FLUSH_BYTES)
        self._buffer = torch.empty(self.nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self._buffer.zero_()


def time_launches(
    launch: Launch,
    *,
    options: TimingOptions,
    flush: Launch | None = None,
    prepare: Launch | None = None,
) -> TimingStats:
    """Time `launch` on the current stream of the current device.

    Args:
        launch: enqueues one launch on `torch.cuda.current_stream()` (read at call time, so
            that graph capture sees its capture stream). Must not synchronize.
        options: sample budget and method.
        flush: run before each sample, outside the timed interval (events method only).
        prepare: run before every launch, warm-up included, outside the timed interval with
            events and inside the graph with graphs (it must then be capturable); used to
            re-zero a Stream-K workspace, whose barrier counters the kernel does not reset.

    Returns:
        Statistics of per-launch milliseconds.

    Raises:
        RuntimeError: a CUDA error surfaced at a synchronization (the context may be lost),
            or `launch` reported a failure.
    """

    def once() -> None:
        if prepare is not None:
            prepare()
        launch()

    estimate = _estimate_ms(once)
    if options.graph:
        return summarize(_graph_samples(once, estimate, options))
    for _ in range(_warmup_count(estimate, options)):
        once()

    def untimed() -> None:
        if flush is not None:
            flush()
        if prepare is not None:
            prepare()

    return summarize(_time_each(sample_count(estimate, options), launch, untimed))


def _warmup_count(per_launch_ms: float, options: TimingOptions) -> int:
    return min(options.max_samples, math.ceil(options.warmup_ms / per_launch_ms))


def _estimate_ms(once: Launch) -> float:
    once()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(ESTIMATE_LAUNCHES):
        once()
    end.record()
    end.synchronize()
    return max(start.elapsed_time(end) / ESTIMATE_LAUNCHES, 1e-3)


def _time_each(n: int, timed: Launch, untimed: Launch | None = None) -> list[float]:
    """Milliseconds of `timed`, n times, each after `untimed` (outside the events)."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    # Enqueue everything, then synchronize once: work queued ahead (the flush) keeps the GPU
    # busy while the host enqueues, so the host launch path stays outside the events.
    for start, end in zip(starts, ends):
        if untimed is not None:
            untimed()
        start.record()
        timed()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def _graph_samples(once: Launch, estimate_ms: float, options: TimingOptions) -> list[float]:
    reps = max(1, min(MAX_GRAPH_LAUNCHES, math.ceil(GRAPH_REPLAY_MS / estimate_ms)))
    # Warm up on a side stream before capture, as torch.cuda.graphs recommends (cuBLAS
    # allocates its per-stream workspace lazily).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            once()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            once()
    try:
        for _ in range(_warmup_count(estimate_ms * reps, options)):
            graph.replay()
        samples = _time_each(sample_count(estimate_ms * reps, options), graph.replay)
        return [s / reps for s in samples]
    finally:
        graph.reset()
