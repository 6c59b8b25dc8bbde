"""Timing in a regime (cutlass_tune/regime.py): the calls of each side with what a model runs
between them, in alternating blocks, as `time_sustained` does back to back.

Each side is a list of launches, one per operand copy (rotating past L2, as in `time_sustained`).
A block enqueues the regime's plan (`regime.plan`): runs of calls, each run followed by a
memory-bound copy and/or an idle gap. Everything is enqueued ahead from Python (no CUDA graph: a
graph cannot hold timing events); the gap is a one-thread spin kernel (`torch.cuda._sleep`), so the
board idles while the host stays ahead of the GPU.

The timed region is the call alone: a CUDA event pair around each call, the gap and the copy
outside. A duty-cycle subtraction (block time less the gaps) was the other way; it would carry
the gap's own error into the kernel's time, and the spin's length in time follows the very clock
the regime changes (it counts cycles), so its error would differ between regimes. A call whose
opening event the GPU had already passed when the host enqueued it (the host fell behind, so its
launch time may sit inside the events) is dropped, and the side's next call is preceded (outside
its events) by a spin as long as the host took to enqueue the dropped one, so that the host gets
ahead again (`_Headroom`): a side whose call is many launches (torch's expert loop over 128
experts) takes longer to enqueue than the GPU takes to run it, and without that spin the host
never got ahead in a regime of short copies, every call was dropped and the whole measurement
failed. The GPU would idle waiting for that host in a model too, so the spin does not make
the regime idler than eager code makes it. A sample is one block's mean time per kept call; the
statistics are the median and the p20-p80 spread over blocks, per side, with the calls dropped.

A side whose median time per call in the regime is more than `MAX_SLOWDOWN` times its time back
to back (`_estimate_ms`, before the regime) was not timed alone between its events: no regime's
clock slows a call that much (the power cap against the top clock is a factor of about 1.4),
so the events held the regime's gap or copy, or host time. Such a timing raises instead of
giving a ratio (`check --regime idle-gap:200us` once read torch's 28 us cuBLAS GEMM at 341 us a
call, a ratio of 11.9 that was nothing of the kind).

Each side first runs alone in the regime for its share of `SUSTAINED_SETTLE_MS`, so that the
clock settles at what the regime gives it; the board's mean power meanwhile (gaps included: the
power the regime draws) is read as `time_sustained` reads it. The SM clock is read after each
block, as in `time_sustained`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence

import torch

from ..measurement import TimingMethod
from ..regime import Regime, RegimePlan, RegimeSpec, plan, spin_cycles
from ._timing import (
    SUSTAINED_BLOCK_MS,
    SUSTAINED_SETTLE_MS,
    Launch,
    Probe,
    Reading,
    TimingOptions,
    TimingStats,
    _cycle,
    _estimate_ms,
    _new_event,
    _spin,
    _sustained_stats,
    _window_power,
    sample_count,
    time_sustained,
)

CALIBRATE_CYCLES = 2_000_000
"""Cycles of the spin that measures the clock's rate before a regime is timed (about 1 ms)."""
MAX_SLOWDOWN = 2.0
"""Largest median time per call in a regime over the same call's time back to back that is taken
as the call's own: beyond it the events held more than the call (see the module's docstring)."""
HEADROOM_FACTOR = 1.5
HEADROOM_MIN_US = 20.0
"""The spin after a dropped call: this factor times the host's time enqueueing it, plus this much
(the events' own enqueueing)."""


def time_regime(sides: Sequence[Sequence[Launch]], spec: RegimeSpec, *, options: TimingOptions,
                probe: Probe | None = None, capture: bool = True,
                names: Sequence[str] | None = None) -> list[TimingStats]:
    """Time each side's launches in the regime `spec`, sides alternating block by block.

    Args:
        sides: per side, one launch per operand copy, each safe to repeat (it re-arms its own
            workspace).
        spec: the regime; SUSTAINED is `time_sustained` (`capture` then says graph or Python loop).
        options: the sample budget (`budget_ms`, `min_samples`, `max_samples`, `warmup_ms`).
        probe: reads energy and the SM clock (None: no clock, no power).
        names: what each side is, for the errors (default: its index).

    Returns:
        One `TimingStats` per side: per-call milliseconds, the median SM clock after its blocks,
        its mean power in the regime and its energy per call (`power_w` times the median).

    Raises:
        RuntimeError: a CUDA error, a side whose every call was dropped, or a side read more than
            `MAX_SLOWDOWN` times its time back to back (each named, with its dropped calls).
    """
    if spec.regime is Regime.SUSTAINED:
        return time_sustained(sides, options=options, probe=probe, capture=capture)
    named = list(names) if names is not None and len(names) == len(sides) else [f"side {i}" for i in range(len(sides))]
    calls = [_cycle(launches) for launches in sides]
    estimates = [_estimate_ms(call) for call in calls]
    filler = _Filler(spec)
    cycles_per_us = _cycles_per_us()
    plans = [plan(spec, estimate, copy_ms_per_mib=filler.ms_per_mib, block_ms=SUSTAINED_BLOCK_MS)
             for estimate in estimates]
    filler.size(max(p.copy_bytes for p in plans))

    rate = [cycles_per_us]
    headroom = [_Headroom(cycles_per_us) for _ in sides]

    def block(side: int, timed: bool = False) -> list[tuple[torch.cuda.Event, torch.cuda.Event]]:
        return _enqueue(calls[side], plans[side], filler, spin_cycles(plans[side].gap_us, rate[0]),
                        headroom[side] if timed else None)

    def untimed(side: int) -> None:
        block(side)

    settle = max(options.warmup_ms, SUSTAINED_SETTLE_MS) / len(sides)
    power = [_window_power(functools.partial(untimed, side), settle, probe) for side in range(len(sides))]
    # The spin counts SM cycles: at the clock the regime settled at (MHz = cycles per us), not the
    # clock it was calibrated at before, a gap lasts what it was asked to.
    settled = probe().sm_mhz if probe is not None else None
    rate[0] = float(settled) if settled else cycles_per_us
    for h in headroom:
        h.cycles_per_us = rate[0]
    n = sample_count(SUSTAINED_BLOCK_MS * len(sides), options)
    times: list[list[float]] = [[] for _ in sides]
    clocks: list[list[int]] = [[] for _ in sides]
    for i in range(n):
        for j in range(len(sides)):
            side = (i + j) % len(sides)
            pairs = block(side, timed=True)
            torch.cuda.synchronize()
            if pairs:
                times[side].append(sum(s.elapsed_time(e) for s, e in pairs) / len(pairs))
            reading = probe() if probe is not None else Reading()
            if reading.sm_mhz is not None:
                clocks[side].append(reading.sm_mhz)
    if not all(times):
        never = [named[i] for i, t in enumerate(times) if not t]
        raise RuntimeError(f"timing in regime {spec.name}: the host never got ahead of the GPU on "
                           f"{', '.join(never)} ({_drops(named, headroom)})")
    stats = [dataclasses.replace(_sustained_stats(t, c, w), dropped=h.dropped)
             for t, c, w, h in zip(times, clocks, power, headroom)]
    slow = [i for i, (st, estimate) in enumerate(zip(stats, estimates)) if st.median_ms > MAX_SLOWDOWN * estimate]
    if slow:
        read = "; ".join(f"{named[i]}: {stats[i].median_ms * 1000:.1f} us a call against "
                         f"{estimates[i] * 1000:.1f} us back to back" for i in slow)
        raise RuntimeError(f"timing in regime {spec.name}: {read}, more than {MAX_SLOWDOWN:g}x: the events held "
                           f"more than the call (the regime's gap or copy, or host time; {_drops(named, headroom)})")
    return stats


def _drops(named: Sequence[str], headroom: Sequence[_Headroom]) -> str:
    return "calls dropped: " + ", ".join(f"{name} {h.dropped}" for name, h in zip(named, headroom))


@dataclasses.dataclass
class _Headroom:
    """A side's spin before its next timed call after one was dropped: `HEADROOM_FACTOR` times the
    host's time enqueueing the dropped call (at `cycles_per_us`), so that the host is ahead of the
    GPU when it enqueues the next; `dropped` counts the side's dropped calls."""

    cycles_per_us: float
    cycles: int = 0
    dropped: int = 0

    def before(self) -> None:
        """The spin owed by a drop, if any (outside the next call's events)."""
        if self.cycles:
            _spin(self.cycles)
            self.cycles = 0

    def drop(self, host_us: float) -> None:
        self.dropped += 1
        self.cycles = spin_cycles(HEADROOM_FACTOR * host_us + HEADROOM_MIN_US, self.cycles_per_us)


def _enqueue(call: Launch, p: RegimePlan, filler: _Filler, cycles: int,
             headroom: _Headroom | None) -> list[tuple[torch.cuda.Event, torch.cuda.Event]]:
    """One block of `p` on the current stream: each call between two events where `headroom` is
    given (a timed block), the calls whose opening event the GPU had reached before the host
    enqueued them left out, each followed by the headroom spin before the side's next call."""
    kept = []
    for _ in range(p.runs):
        for _ in range(p.run):
            if headroom is None:
                call()
                continue
            headroom.before()
            start, end = _new_event(), _new_event()
            start.record()
            began = time.perf_counter()
            call()
            host_us = (time.perf_counter() - began) * 1e6
            end.record()
            if start.query():  # the GPU got here first: host time may sit between the events
                headroom.drop(host_us)
            else:
                kept.append((start, end))
        filler(p.copy_bytes)
        if cycles:
            _spin(cycles)
    return kept


class _Filler:
    """The memory-bound work between calls: a copy of part of a buffer into another (INTERLEAVED's
    copy, AS_CAPTURED's filler); `ms_per_mib` is measured once, on a copy larger than L2."""

    PROBE_MIB = 256

    def __init__(self, spec: RegimeSpec):
        self._src = self._dst = torch.empty(0, dtype=torch.uint8, device="cuda")
        self.ms_per_mib = 1.0
        if spec.regime in (Regime.INTERLEAVED, Regime.AS_CAPTURED):
            self.size(self.PROBE_MIB << 20)
            self(self.PROBE_MIB << 20)
            start, end = _new_event(), _new_event()
            start.record()
            for _ in range(4):
                self(self.PROBE_MIB << 20)
            end.record()
            end.synchronize()
            self.ms_per_mib = max(start.elapsed_time(end) / (4 * self.PROBE_MIB), 1e-6)
        self.size(int(spec.copy_mib * (1 << 20)))

    def size(self, nbytes: int) -> None:
        if nbytes > self._src.numel():
            self._src = self._dst = torch.empty(0, dtype=torch.uint8, device="cuda")  # free first
            self._src = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
            self._dst = torch.empty_like(self._src)

    def __call__(self, nbytes: int) -> None:
        if nbytes:
            self._dst[:nbytes].copy_(self._src[:nbytes])


def _cycles_per_us() -> float:
    """The spin kernel's cycles per microsecond at the current clock."""
    _spin(1000)
    start, end = _new_event(), _new_event()
    start.record()
    _spin(CALIBRATE_CYCLES)
    end.record()
    end.synchronize()
    return CALIBRATE_CYCLES / max(start.elapsed_time(end) * 1000, 1e-3)


def regime_options(options: TimingOptions, spec: RegimeSpec) -> TimingOptions:
    """`options` timing in `spec` (the sustained method: a regime is a setting of it)."""
    return dataclasses.replace(options, method=TimingMethod.SUSTAINED, regime=spec)
