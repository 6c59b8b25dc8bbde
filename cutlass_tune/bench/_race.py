"""Racing the run-time variants of one kernel on one problem.

A kernel's variants (raster order, swizzle, Stream-K decomposition and splits) usually sit within
a few percent of each other, and most kernels of a sweep sit well behind the problem's best. Timing
every variant at the full budget spends most of the GPU's time on figures that cannot change the
outcome. So a race first times every variant briefly (`RaceOptions.brief`, same method, same
pairing, each output verified as always), then gives the full budget only to the variants that can
still be the problem's best: those whose brief score, raised by the noise measured in the brief
samples, reaches the leader (the best brief score of the kernel, or the problem's best full score
so far, `bar`, whichever is higher). The others are kept with their brief figures as
`Status.COARSE`: they steer the search, and never rank above a full measurement (nothing ranks a
coarse row).

A score is the paired ratio to the baseline when timing is paired (robust to the clock's drift
between samples), else TFLOP/s; `bar` must be of the same kind.

Pure functions of recorded figures: tested on the CPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..measurement import Measurement
from ..status import Status
from ._timing import TimingOptions

BRIEF_BUDGET_MS = 12.0
"""GPU time of a variant's brief timing, both sides of a pair together (the full default: 100)."""
BRIEF_MIN_SAMPLES = 5
BRIEF_WARMUP_MS = 5.0
NOISE_FLOOR = 0.02
"""Relative margin granted on top of the measured spread: what two brief timings of one variant
can differ by when their spreads read near zero."""


@dataclasses.dataclass(frozen=True)
class RaceOptions:
    """How a race runs.

    Attributes:
        budget_ms, min_samples, warmup_ms: the brief timing of every variant (method and pairing
            are the full timing's).
        noise_floor: margin added to the measured spreads when deciding who can still win.
    """

    budget_ms: float = BRIEF_BUDGET_MS
    min_samples: int = BRIEF_MIN_SAMPLES
    warmup_ms: float = BRIEF_WARMUP_MS
    noise_floor: float = NOISE_FLOOR

    def __post_init__(self) -> None:
        if self.budget_ms <= 0 or self.warmup_ms < 0 or self.min_samples < 1 or self.noise_floor < 0:
            raise ValueError("a race needs a positive budget, at least one sample and no negative margins")

    def brief(self, full: TimingOptions) -> TimingOptions:
        """The brief timing: `full`'s method and pairing on this race's budget."""
        return dataclasses.replace(full, budget_ms=self.budget_ms, warmup_ms=self.warmup_ms,
                                   min_samples=min(self.min_samples, full.max_samples))


@dataclasses.dataclass(frozen=True)
class Entry:
    """One variant's brief result: its score (None when it failed or was not timed) and the
    relative spread of its samples (the larger of the kernel's and its paired baseline's)."""

    score: float | None
    spread: float


def score(m: Measurement, paired: bool) -> float | None:
    """The race's score of a timed measurement: paired ratio, else TFLOP/s; None if untimed."""
    if m.status not in (Status.OK, Status.UNSTABLE) or not m.median_ms:
        return None
    if paired:
        return m.baseline_median_ms / m.median_ms if m.baseline_median_ms else None
    return m.tflops


def entry(m: Measurement, paired: bool) -> Entry:
    spreads = [(hi - lo) / mid for lo, mid, hi in ((m.p20_ms, m.median_ms, m.p80_ms),
                                                    (m.baseline_p20_ms, m.baseline_median_ms, m.baseline_p80_ms))
               if lo is not None and mid and hi is not None]
    return Entry(score(m, paired), max(spreads, default=0.0))


def contenders(entries: Sequence[Entry], bar: float | None, options: RaceOptions) -> list[int]:
    """Indices of `entries` that get the full budget.

    The leader is the best brief score, or `bar` (the problem's best full score so far) where
    higher. An entry contends when its score times (1 + its spread + the leader's spread +
    `noise_floor`) reaches the leader: within what the brief samples could be off by. The
    kernel's own best brief entry always contends unless `bar` is beyond its reach too; an
    entry without a score never does (its failure is already final).
    """
    timed = [(i, e) for i, e in enumerate(entries) if e.score is not None]
    if not timed:
        return []
    best = max((e for _, e in timed), key=lambda e: e.score or 0.0)
    assert best.score is not None
    leader, leader_spread = best.score, best.spread
    if bar is not None and bar > leader:
        leader, leader_spread = bar, 0.0  # a full measurement: its noise is small beside a brief one's
    out = []
    for i, e in timed:
        assert e.score is not None
        if e.score * (1 + e.spread + leader_spread + options.noise_floor) >= leader:
            out.append(i)
    return out


def coarse(m: Measurement, leader: float, paired: bool) -> Measurement:
    """`m`, a brief timing that lost its race, kept as COARSE with the reason."""
    kind = "ratio" if paired else "TFLOP/s"
    found = score(m, paired)
    return dataclasses.replace(
        m, status=Status.COARSE,
        reason=f"timed briefly ({m.samples} samples): {kind} {found:.3f} cannot reach the leader's {leader:.3f} "
               "within the measured noise")


def leader_of(entries: Sequence[Entry], bar: float | None) -> float | None:
    """The score a race's contenders are measured against."""
    scores = [e.score for e in entries if e.score is not None] + ([bar] if bar is not None else [])
    return max(scores, default=None)
