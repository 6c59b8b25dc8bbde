"""Timing one launch on the GPU: the same function times every candidate and the baseline.

Three methods, named in `Measurement.method`:

- ``events`` (default): each sample is one launch between two CUDA events, preceded (outside
  the events) by a write of a buffer twice the size of L2, so every launch starts L2-cold.
- ``graph``: `reps` launches captured in one CUDA graph, each replay between two events, the
  sample being replay time / reps. L2 stays warm and launch overhead disappears; it suits
  problems so small that the host launch path would dominate.
- ``sustained``: what a model's steady stream of GEMMs gets. Launches go back to back inside a
  CUDA graph, each on the next of several operand copies that together exceed twice the L2
  (each launch reads operands the previous one did not leave in L2, as successive layers do),
  replayed in blocks of about `SUSTAINED_BLOCK_MS` after each side has run alone for its share
  of `SUSTAINED_SETTLE_MS`, so that clocks and power have settled (large GEMMs run at the power
  cap there, not at the burst clocks a single launch sees). A sample is one block's time per
  launch; the board's mean power during the settling run (NVML's energy counter between two
  of its updates, `_window_power`) times the median gives millijoules per launch.

Either method can be *paired* (`TimingOptions.paired`): the kernel and the cuBLAS baseline are
sampled alternately, sample by sample, with the order swapped every sample, so both see the
same clocks, temperature and power state (`time_paired`). The board's power-limited clock
drifts by a few percent over minutes; a baseline taken minutes before a kernel carries that
drift into the ratio, a paired one does not.

Only ratios measured with the same method in the same run compare (see the facts file).

Host time never enters a sample: the events bracket the launch only if the host enqueued it
(and the closing event) before the GPU reached the opening event. Work queued ahead (the
flush) normally guarantees that; when the host falls behind (a busy CPU, a slow launch path)
the sample is dropped and a GPU spin of growing length goes before the next sample, so that
the host gets ahead again (`_time_interleaved`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
import time
from collections.abc import Callable, Sequence

import torch

from ..measurement import TimingMethod, TimingScheme
from ..regime import SUSTAINED, Regime, RegimeSpec

ESTIMATE_LAUNCHES = 5
GRAPH_REPLAY_MS = 1.0
"""Target duration of one graph replay; short kernels are repeated inside it."""
MAX_GRAPH_LAUNCHES = 100
MIN_FLUSH_BYTES = 32 << 20
HEADROOM_START_CYCLES = 200_000
"""GPU spin queued before the sample that follows a dropped one: about 0.1 ms on Hopper clocks,
doubled after every drop up to HEADROOM_MAX_CYCLES (about 2 ms)."""
HEADROOM_MAX_CYCLES = 3_200_000
MAX_ATTEMPTS_PER_SAMPLE = 4
SUSTAINED_BLOCK_MS = 100.0
"""Length of one sustained sample: long against the board's power control (tens of ms) and
NVML's energy counter updates, short enough that a budget holds ten of each side."""
SUSTAINED_SETTLE_MS = 1600.0
"""Back-to-back work before the first sustained sample (at least; `warmup_ms` may ask more),
shared among the sides; each side's mean power is read during its share."""
POWER_GUARD_MS = 200.0
"""Time a side runs before its power is read: the power control's response to the switch."""
POWER_POLL_S = 0.0005
POWER_MIN_WINDOW_S = 0.3
"""Shortest time between two counter updates that gives a power figure (else None)."""
MAX_SUSTAINED_LAUNCHES = 1000
"""Launches captured in one sustained graph; a block replays it as often as it takes."""
MAX_ROTATION = 64
"""Operand copies of a sustained measurement, at most (small problems need the most)."""

Launch = Callable[[], object]
"""What is timed or run around it; what it returns is ignored (`Tensor.zero_` re-arms a workspace)."""


@dataclasses.dataclass(frozen=True)
class Reading:
    """What the board reports at one instant: NVML's total energy counter (millijoules since
    the driver loaded) and the SM clock; None where NVML does not report it."""

    energy_mj: float | None = None
    sm_mhz: int | None = None


Probe = Callable[[], Reading]
"""Reads the board after a synchronization (see `bench._env.ClockMonitor.reading`)."""


@dataclasses.dataclass(frozen=True)
class TimingOptions:
    """How long and how to measure one (kernel, problem, run-time variant).

    Attributes:
        budget_ms: GPU time to spend on samples; the sample count follows from an estimate.
        min_samples, max_samples: bounds on the sample count.
        warmup_ms: GPU time of untimed launches before sampling (`sustained` runs at least
            `SUSTAINED_SETTLE_MS`).
        method: how launches are timed (see the module's docstring).
        paired: time each kernel alternately with the cuBLAS baseline of its problem; the
            budget then covers both.
        regime: what runs between two calls (cutlass_tune/regime.py; bench/_regimes.py times
            it); a regime other than SUSTAINED is a setting of the sustained method; IN_MODEL is
            no regime of the bench (`RegimeSpec.for_bench` raises RegimeError).
    """

    budget_ms: float = 100.0
    min_samples: int = 10
    max_samples: int = 1000
    warmup_ms: float = 25.0
    method: TimingMethod = TimingMethod.EVENTS
    paired: bool = False
    regime: RegimeSpec = SUSTAINED

    def __post_init__(self) -> None:
        if self.budget_ms <= 0 or self.warmup_ms < 0:
            raise ValueError("budget_ms must be positive and warmup_ms not negative")
        self.regime.for_bench()
        if self.regime.regime is not Regime.SUSTAINED and self.method is not TimingMethod.SUSTAINED:
            raise ValueError(f"regime {self.regime.name} is timed by the sustained method, not {self.method.value}")
        if not 1 <= self.min_samples <= self.max_samples:
            raise ValueError("need 1 <= min_samples <= max_samples")

    @property
    def scheme(self) -> TimingScheme:
        """`method` and `paired`: what a results store binds to."""
        return TimingScheme(self.method, self.paired)


@dataclasses.dataclass(frozen=True)
class TimingStats:
    median_ms: float
    p20_ms: float
    p80_ms: float
    samples: int
    dropped: int = 0
    """Samples thrown away because the host enqueued the launch after the GPU had reached the
    opening event, which would have put host time inside the interval."""
    energy_mj: float | None = None
    """Millijoules the board drew per launch (sustained timing, where NVML reports energy)."""
    sm_mhz: float | None = None
    """Median SM clock at the end of the samples (sustained timing)."""
    power_w: float | None = None
    """Mean board power over the samples (sustained timing)."""

    @property
    def spread(self) -> float:
        """(p80 - p20) / median: how widely the samples scatter."""
        return (self.p80_ms - self.p20_ms) / self.median_ms


def percentile(ordered: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of already sorted values; q in [0, 1]."""
    if not ordered:
        raise ValueError("no samples")
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(samples_ms: Sequence[float], dropped: int = 0) -> TimingStats:
    """Median, 20th and 80th percentile of per-launch times. Raises ValueError when empty."""
    ordered = sorted(samples_ms)
    return TimingStats(
        median_ms=percentile(ordered, 0.5),
        p20_ms=percentile(ordered, 0.2),
        p80_ms=percentile(ordered, 0.8),
        samples=len(ordered),
        dropped=dropped,
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
        options: sample budget and method (`options.paired` is ignored: see `time_paired`).
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
    return time_paired(launch, None, options=options, flush=flush, prepare=prepare)[0]


def time_paired(
    launch: Launch,
    baseline: Launch | None,
    *,
    options: TimingOptions,
    flush: Launch | None = None,
    prepare: Launch | None = None,
) -> tuple[TimingStats, TimingStats | None]:
    """Time `launch` and `baseline` alternately, by one method, in one sampling loop.

    Sample i times both, `launch` first when i is even and `baseline` first when odd, each
    after its own flush. The sample count fills `options.budget_ms` with the two together.
    `prepare` (see `time_launches`) belongs to `launch` only. With `baseline` None this is
    plain `time_launches`.

    Returns:
        (statistics of `launch`, statistics of `baseline` or None), per-launch milliseconds.

    Raises:
        RuntimeError: as `time_launches`.
    """

    found = time_sides([launch] + ([] if baseline is None else [baseline]), options=options, flush=flush,
                       prepare=prepare)
    return found[0], (found[1] if baseline is not None else None)


def time_sides(
    launches: Sequence[Launch],
    *,
    options: TimingOptions,
    flush: Launch | None = None,
    prepare: Launch | None = None,
) -> list[TimingStats]:
    """`time_paired` of any number of sides: sample i times each of `launches` once, the order
    rotating by one every sample, each after its own flush; `prepare` belongs to the first.
    A grouped problem's baseline row times torch._grouped_mm, the expert loop and the dense
    GEMM so, in one loop.

    Returns:
        One `TimingStats` per launch, in order (per-launch milliseconds).

    Raises:
        RuntimeError: as `time_launches`.
    """
    if not launches:
        raise ValueError("nothing to time")
    first = launches[0]

    def once() -> None:
        if prepare is not None:
            prepare()
        first()

    targets = [_Timed(once, first, prepare)] + [_Timed(other, other, None) for other in launches[1:]]
    for t in targets:
        t.estimate_ms = _estimate_ms(t.once)
    if options.method is TimingMethod.SUSTAINED:
        return time_sustained([[t.once] for t in targets], options=options)
    if options.method is TimingMethod.GRAPH:
        samples, dropped = _graph_samples(targets, options)
    else:
        for t in targets:
            for _ in range(_warmup_count(t.estimate_ms, options)):
                t.once()
        per_sample = sum(t.estimate_ms for t in targets)
        samples, dropped = _time_interleaved(sample_count(per_sample, options), targets, flush)
    return [summarize(s, d) for s, d in zip(samples, dropped)]


@dataclasses.dataclass
class _Timed:
    """One side of a timing loop: `once` is safe to repeat (re-arms), `timed` is what the
    events enclose, `prepare` runs outside them."""

    once: Launch
    timed: Launch
    prepare: Launch | None
    estimate_ms: float = 0.0


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


def _new_event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)


def _spin(cycles: int) -> None:
    torch.cuda._sleep(cycles)


def _time_interleaved(n: int, targets: Sequence[_Timed], flush: Launch | None, *,
                      new_event: Callable[[], torch.cuda.Event] = _new_event,
                      spin: Callable[[int], None] = _spin,
                      synchronize: Launch | None = None) -> tuple[list[list[float]], list[int]]:
    """Milliseconds of each target's `timed`, n samples each, the order rotating per sample;
    `flush` and the target's `prepare` run before each, outside the events. Also returns how
    many samples of each target were dropped.

    Everything is enqueued before one synchronization: the work queued ahead keeps the GPU
    busy while the host enqueues. Right after enqueueing a sample the host asks whether the GPU
    has already passed its opening event; if so, the GPU may have waited for the launch and the
    sample is dropped, and one spin (`HEADROOM_START_CYCLES`, doubling per drop) goes before
    the next sample, giving the host time to get ahead again. The spin runs only after a drop:
    spinning before every sample would idle the GPU between launches and change the clocks
    that both sides are measured at. At most MAX_ATTEMPTS_PER_SAMPLE * n rounds are tried.

    Raises:
        RuntimeError: a target kept no sample at all.
    """
    kept: list[list[tuple[torch.cuda.Event, torch.cuda.Event]]] = [[] for _ in targets]
    dropped = [0] * len(targets)
    headroom, spin_next = 0, False
    for i in range(MAX_ATTEMPTS_PER_SAMPLE * n):
        if all(len(k) >= n for k in kept):
            break
        for j in range(len(targets)):
            index = (i + j) % len(targets)
            if len(kept[index]) >= n:
                continue
            t = targets[index]
            if spin_next:
                spin(headroom)
                spin_next = False
            if flush is not None:
                flush()
            if t.prepare is not None:
                t.prepare()
            start, end = new_event(), new_event()
            start.record()
            t.timed()
            end.record()
            if start.query():  # the GPU got here first: host time may sit between the events
                dropped[index] += 1
                headroom = min(max(2 * headroom, HEADROOM_START_CYCLES), HEADROOM_MAX_CYCLES)
                spin_next = True
            else:
                kept[index].append((start, end))
    (synchronize or torch.cuda.synchronize)()
    if not all(kept):
        raise RuntimeError(f"timing: the host never got ahead of the GPU in {MAX_ATTEMPTS_PER_SAMPLE * n} "
                           f"tries (dropped {dropped}); the host is too busy to time this launch")
    return [[s.elapsed_time(e) for s, e in pairs] for pairs in kept], dropped


def _graph_samples(targets: Sequence[_Timed], options: TimingOptions) -> tuple[list[list[float]], list[int]]:
    """Per-launch milliseconds of each target from replays of a graph of `reps` launches
    (one graph per target, replays alternating like `_time_interleaved`), and drops."""
    graphs, reps = [], []
    try:
        for t in targets:
            r = max(1, min(MAX_GRAPH_LAUNCHES, math.ceil(GRAPH_REPLAY_MS / t.estimate_ms)))
            graphs.append(_capture(t.once, r))
            reps.append(r)
        replays = [_Timed(g.replay, g.replay, None, t.estimate_ms * r)
                   for g, t, r in zip(graphs, targets, reps)]
        for t in replays:
            for _ in range(_warmup_count(t.estimate_ms, options)):
                t.once()
        n = sample_count(sum(t.estimate_ms for t in replays), options)
        samples, dropped = _time_interleaved(n, replays, None)
        return [[s / r for s in side] for side, r in zip(samples, reps)], dropped
    finally:
        for g in graphs:
            g.reset()


def _capture(once: Launch, reps: int) -> torch.cuda.CUDAGraph:
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
    return graph


def rotation_count(bytes_per_copy: int, l2_bytes: int, *, memory_bytes: int | None = None) -> int:
    """Operand copies a sustained measurement rotates through: enough that together they
    exceed twice the L2, at least 2 (one copy larger than L2 still leaves its tail there for
    the next launch), at most MAX_ROTATION, and no more than half of `memory_bytes` holds."""
    wanted = max(2, math.ceil(2 * l2_bytes / max(bytes_per_copy, 1)) + 1)
    if memory_bytes is not None:
        wanted = min(wanted, max(2, memory_bytes // 2 // max(bytes_per_copy, 1)))
    return min(wanted, MAX_ROTATION)


def time_sustained(sides: Sequence[Sequence[Launch]], *, options: TimingOptions,
                   probe: Probe | None = None, capture: bool = True) -> list[TimingStats]:
    """Time each side's launches back to back, as a model's stream of GEMMs runs them.

    Each side is a list of launches, one per operand copy, each safe to repeat and capturable
    (it re-arms its own workspace); its graph holds them in turn, up to `MAX_SUSTAINED_LAUNCHES`
    (about `SUSTAINED_BLOCK_MS` of work). With `capture` False a block calls the launches from
    Python instead, as eager code does: the host's time per call counts wherever the GPU waits
    for it. After `SUSTAINED_SETTLE_MS` (or `options.warmup_ms`)
    of blocks of every side in turn, sample i replays each side's graph for one block, the
    order rotating per sample; `probe`, read around each block after it finished, gives the
    energy and the clock. The sample count fills `options.budget_ms` within its bounds.

    Returns:
        One `TimingStats` per side: per-launch milliseconds, with energy per launch, median SM
        clock and mean power where `probe` reports them.

    Raises:
        RuntimeError: as `time_launches`.
    """
    graphs: list[torch.cuda.CUDAGraph] = []
    try:
        plans = []
        for launches in sides:
            estimate = _estimate_ms(_cycle(launches))
            reps = max(len(launches), min(MAX_SUSTAINED_LAUNCHES, math.ceil(SUSTAINED_BLOCK_MS / estimate)))
            if capture:
                graphs.append(_capture(_cycle(launches), reps))
            plans.append((reps, max(1, round(SUSTAINED_BLOCK_MS / (estimate * reps)))))
        calls = [_cycle(launches) for launches in sides]

        def block(side: int) -> None:
            reps, replays = plans[side]
            for _ in range(replays):
                if capture:
                    graphs[side].replay()
                else:
                    for _ in range(reps):
                        calls[side]()

        # Each side alone first, long enough for the clocks to settle at its own power draw,
        # its mean power read meanwhile; then alternating samples.
        settle = max(options.warmup_ms, SUSTAINED_SETTLE_MS) / len(sides)
        power = [_window_power(functools.partial(block, side), settle, probe if capture else None)
                 for side in range(len(sides))]
        n = sample_count(SUSTAINED_BLOCK_MS * len(sides), options)
        times: list[list[float]] = [[] for _ in sides]
        clocks: list[list[int]] = [[] for _ in sides]
        for i in range(n):
            for j in range(len(sides)):
                side = (i + j) % len(sides)
                start, end = _new_event(), _new_event()
                start.record()
                block(side)
                end.record()
                end.synchronize()
                times[side].append(start.elapsed_time(end) / (plans[side][0] * plans[side][1]))
                reading = probe() if probe is not None else Reading()
                if reading.sm_mhz is not None:
                    clocks[side].append(reading.sm_mhz)
    finally:
        for g in graphs:
            g.reset()
    return [_sustained_stats(t, c, w) for t, c, w in zip(times, clocks, power)]


def _window_power(block: Callable[[], None], duration_ms: float, probe: Probe | None) -> float | None:
    """Run `block` back to back for about `duration_ms` and return the board's mean power
    meanwhile (watts), or None without an energy counter or with `probe` None.

    NVML's energy counter moves in steps (every 100 ms on the H200, benchmarks/nvml_cadence.py):
    a difference over a fixed interval is off by up to a step, and intervals in step with the
    updates credit one side with all of them. So a thread polls the counter while the GPU
    works, and the energy between two of its own updates (the first after `POWER_GUARD_MS`,
    the last before the work ends) is divided by the host time between them. The thread does
    not depend on the launching thread returning before the GPU finishes its work.
    """
    blocks = max(1, math.ceil(duration_ms / SUSTAINED_BLOCK_MS))
    if probe is None or probe().energy_mj is None:
        for _ in range(blocks):
            block()
        torch.cuda.synchronize()
        return None
    torch.cuda.synchronize()
    updates: list[tuple[float, float]] = []
    stop = threading.Event()

    def poll() -> None:
        previous = probe().energy_mj
        while not stop.is_set():
            energy = probe().energy_mj
            if energy is not None and energy != previous:
                updates.append((time.perf_counter(), energy))
                previous = energy
            time.sleep(POWER_POLL_S)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    begun = time.perf_counter()
    try:
        for _ in range(blocks):
            block()
        torch.cuda.synchronize()
    finally:
        ended = time.perf_counter()
        stop.set()
        poller.join()
    return power_between([u for u in updates if begun + POWER_GUARD_MS / 1000 <= u[0] <= ended])


def power_between(updates: Sequence[tuple[float, float]]) -> float | None:
    """The mean power (W) between the first and the last of NVML energy counter updates (host
    seconds, mJ), or None where they span less than `POWER_MIN_WINDOW_S`."""
    if len(updates) < 2 or updates[-1][0] - updates[0][0] < POWER_MIN_WINDOW_S:
        return None
    (t0, e0), (t1, e1) = updates[0], updates[-1]
    return (e1 - e0) / ((t1 - t0) * 1000)  # mJ per ms


def _cycle(launches: Sequence[Launch]) -> Launch:
    """One launch per call, on the next operand copy each time."""
    position = [0]

    def once() -> None:
        launches[position[0] % len(launches)]()
        position[0] += 1

    return once


def _sustained_stats(times: list[float], clocks: list[int], power_w: float | None) -> TimingStats:
    stats = summarize(times)
    energy = power_w * stats.median_ms if power_w is not None else None  # W x ms = mJ
    return dataclasses.replace(stats, energy_mj=energy, sm_mhz=_median(clocks), power_w=power_w)


def _median(values: Sequence[float]) -> float | None:
    return percentile(sorted(values), 0.5) if values else None
