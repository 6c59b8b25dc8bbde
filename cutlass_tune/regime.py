"""Timing regimes: what runs on the GPU between two calls of a GEMM while it is timed.

A kernel's speed depends on the clock it runs at, and the clock on what the board did just
before: back to back, large GEMMs hold an H200 at its power cap (about 1,400-1,450 MHz, 690 W);
with idle time between calls the clock rises to 1,980 MHz. The kernel that wins at the cap is not
always the one that wins at the clocks a model runs it at (benchmarks/regimes.md). So a problem
can be confirmed, and a table entry checked, in any of these regimes but the last, which only
`tune-model` measures:

| regime | between two calls | spelt |
|---|---|---|
| SUSTAINED | nothing: back to back, at the power cap (the `sustained` method) | `sustained` |
| IDLE_GAP | an idle gap of `gap_us` (a one-thread spin kernel: the board idles) | `idle-gap:200us` |
| INTERLEAVED | a copy of `copy_mib` MiB (as a model's elementwise kernels) | `interleaved:64MiB` |
| AS_CAPTURED | a step's duty cycle: busy `busy` of the time, idle gaps of `gap_us` | `as-captured:0.7:150us` |
| IN_MODEL | the model's own step, run as `mode` at `tokens` tokens (0: its own inputs) | `in-model:eager:4096` |

AS_CAPTURED takes its two numbers from a profile of the user's model step (`tune-model` prints
them from its profiled steps: `search._in_model.duty_cycle`). Its plan (`plan`): between two gaps the GPU
runs GEMM calls back to back and, where one call is shorter than the busy time a gap asks for,
a memory-bound copy that fills the rest.

IN_MODEL is no imitation of a model: `tune-model` times the kernels inside the model's own step
(torch.profiler), and records its figures under this regime. The bench cannot time it
(`Regime.in_bench`, `RegimeSpec.for_bench`), and unlike the others its figures choose a
problem's kernel (report/_best.py).

This module is free of torch: the store, the tables and the runtime read a regime's name; the
bench (bench/_regimes.py) times it.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re

from .errors import CutlassTuneError


class RegimeError(CutlassTuneError):
    """A regime spelt in a way no regime reads (`RegimeSpec.parse`)."""


class Regime(str, enum.Enum):
    """What runs between two timed calls (see the module's table)."""

    SUSTAINED = "sustained"
    IDLE_GAP = "idle-gap"
    INTERLEAVED = "interleaved"
    AS_CAPTURED = "as-captured"
    IN_MODEL = "in-model"

    @property
    def column(self) -> str:
        """The prefix of this regime's table columns: `idle_gap` for `idle_gap_ratio`."""
        return self.value.replace("-", "_")

    @property
    def in_bench(self) -> bool:
        """Whether the bench times this regime (`confirm --regime`, `check --regime`): every one
        but IN_MODEL, which `tune-model` measures inside the model's step."""
        return self is not Regime.IN_MODEL


class StepMode(str, enum.Enum):
    """How `tune-model` runs the model's step (bench/_in_model.py): eager (the forward under
    no_grad), compiled (`torch.compile` of the model), graphs (the compiled step replayed from a
    CUDA graph; its candidates are timed in the compiled step)."""

    EAGER = "eager"
    COMPILED = "compiled"
    GRAPHS = "graphs"


DEFAULT_GAP_US = 200.0
"""An idle gap long enough for the board's power control to lift the clock between calls (the
issue's idle-gap figures used gaps of this order) and short against a 100 ms block."""
DEFAULT_COPY_MIB = 64.0
"""A copy larger than the L2 (50 MiB on the H200): it runs at memory bandwidth."""
MAX_GAP_US = 1_000_000.0
MAX_COPY_MIB = 16_384.0
MAX_TOKENS = 1 << 30


@dataclasses.dataclass(frozen=True)
class RegimeSpec:
    """A regime with its parameters. Construct with `parse` or the class methods.

    Attributes:
        regime: which regime.
        gap_us: the idle gap after each run of calls (IDLE_GAP, AS_CAPTURED), microseconds.
        copy_mib: the memory-bound copy after each call (INTERLEAVED), MiB.
        busy: the fraction of the step the GPU is busy (AS_CAPTURED), in (0, 1).
        mode: how the model's step ran (IN_MODEL).
        tokens: the token count the model's step ran at (IN_MODEL; 0: the inputs its function
            returns without one).
    """

    regime: Regime = Regime.SUSTAINED
    gap_us: float = 0.0
    copy_mib: float = 0.0
    busy: float = 1.0
    mode: StepMode | None = None
    tokens: int = 0

    def __post_init__(self) -> None:
        r = self.regime
        wants_gap = r in (Regime.IDLE_GAP, Regime.AS_CAPTURED)
        if wants_gap != (self.gap_us > 0) or not 0 <= self.gap_us <= MAX_GAP_US:
            raise RegimeError(f"regime {r.value}: gap_us {self.gap_us!r:.20} "
                              + (f"must be in (0, {MAX_GAP_US:g}]" if wants_gap else "must be 0"))
        if (r is Regime.INTERLEAVED) != (self.copy_mib > 0) or not 0 <= self.copy_mib <= MAX_COPY_MIB:
            raise RegimeError(f"regime {r.value}: copy_mib {self.copy_mib!r:.20} "
                              + (f"must be in (0, {MAX_COPY_MIB:g}]" if r is Regime.INTERLEAVED else "must be 0"))
        if r is Regime.AS_CAPTURED and not 0 < self.busy < 1:
            raise RegimeError(f"regime as-captured: the busy fraction {self.busy!r:.20} must be in (0, 1)")
        if r is not Regime.AS_CAPTURED and self.busy != 1.0:
            raise RegimeError(f"regime {r.value}: a busy fraction belongs to as-captured only")
        if (r is Regime.IN_MODEL) != (self.mode is not None):
            said = "the step's mode (eager, compiled or graphs) is required" if r is Regime.IN_MODEL \
                else "a step's mode belongs to in-model only"
            raise RegimeError(f"regime {r.value}: {said}")
        if self.mode is not None and not isinstance(self.mode, StepMode):
            raise RegimeError(f"regime in-model: mode {self.mode!r:.20} is not one of eager, compiled, graphs")
        if (isinstance(self.tokens, bool) or not isinstance(self.tokens, int) or not 0 <= self.tokens <= MAX_TOKENS
                or (self.tokens and r is not Regime.IN_MODEL)):
            raise RegimeError(f"regime {r.value}: tokens {self.tokens!r:.20} "
                              + (f"must be a whole number in [0, {MAX_TOKENS}]" if r is Regime.IN_MODEL
                                 else "belong to in-model only"))

    @property
    def name(self) -> str:
        """How it is spelt (`parse` reads it back): `sustained`, `idle-gap:200us`,
        `interleaved:64MiB`, `as-captured:0.7:150us`, `in-model:compiled:4096` (`in-model:eager`
        for a step at its function's own inputs)."""
        r = self.regime
        if r is Regime.IN_MODEL:
            assert self.mode is not None  # __post_init__
            return f"{r.value}:{self.mode.value}" + (f":{self.tokens}" if self.tokens else "")
        if r is Regime.IDLE_GAP:
            return f"{r.value}:{self.gap_us:g}us"
        if r is Regime.INTERLEAVED:
            return f"{r.value}:{self.copy_mib:g}MiB"
        if r is Regime.AS_CAPTURED:
            return f"{r.value}:{self.busy:g}:{self.gap_us:g}us"
        return r.value

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, text: str) -> RegimeSpec:
        """The regime spelt `text` (see the module's table; a bare `idle-gap` or `interleaved`
        takes `DEFAULT_GAP_US` or `DEFAULT_COPY_MIB`).

        Raises:
            RegimeError: any other text, or parameters out of range (one line naming them).
        """
        head, _, rest = str(text).strip().partition(":")
        try:
            regime = Regime(head)
        except ValueError:
            known = ", ".join(r.value for r in Regime)
            raise RegimeError(f"unknown regime {text!r:.60}: use one of {known} (e.g. idle-gap:200us, "
                              "interleaved:64MiB, as-captured:0.7:150us, in-model:compiled:4096)") from None
        try:
            if regime is Regime.SUSTAINED:
                if rest:
                    raise ValueError("sustained takes no parameter")
                return cls()
            if regime is Regime.IDLE_GAP:
                return cls(regime, gap_us=_quantity(rest, "us") if rest else DEFAULT_GAP_US)
            if regime is Regime.INTERLEAVED:
                return cls(regime, copy_mib=_quantity(rest, "MiB") if rest else DEFAULT_COPY_MIB)
            if regime is Regime.IN_MODEL:
                return cls._parse_in_model(rest)
            busy, _, gap = rest.partition(":")
            if not busy or not gap:
                raise ValueError("as-captured takes the busy fraction and the gap: as-captured:0.7:150us")
            return cls(regime, busy=_number(busy), gap_us=_quantity(gap, "us"))
        except ValueError as err:
            raise RegimeError(f"regime {text!r:.60}: {err}") from None

    @classmethod
    def _parse_in_model(cls, rest: str) -> RegimeSpec:
        mode, _, tokens = rest.partition(":")
        modes = ", ".join(m.value for m in StepMode)
        if mode not in {m.value for m in StepMode}:
            raise ValueError(f"in-model takes the step's mode ({modes}) and its token count: in-model:compiled:4096")
        if tokens and not re.fullmatch(r"[0-9]{1,10}", tokens):
            raise ValueError(f"{tokens!r:.20} is not a token count")
        return cls.in_model(StepMode(mode), int(tokens) if tokens else 0)

    @classmethod
    def in_model(cls, mode: StepMode, tokens: int | None = None) -> RegimeSpec:
        """The user's model step run as `mode` at `tokens` tokens (None or 0: the inputs its
        function returns without a token count): where `tune-model` times its candidates."""
        return cls(Regime.IN_MODEL, mode=StepMode(mode), tokens=tokens or 0)

    def for_bench(self) -> RegimeSpec:
        """This regime, where the bench can time it (`Regime.in_bench`).

        Raises:
            RegimeError: the in-model regime, in one line that says `tune-model` measures it.
        """
        if not self.regime.in_bench:
            raise RegimeError(f"regime {self.name}: the bench cannot time a model's step; `cutlass-tune tune-model` "
                              "measures kernels inside the model (its --storage keeps the figures)")
        return self

    @classmethod
    def as_captured(cls, busy: float, gap_us: float) -> RegimeSpec:
        """A model step's duty cycle, from a profile of it: the fraction of the step the GPU is
        busy and the mean length of its idle gaps (`tune-model` feeds it)."""
        return cls(Regime.AS_CAPTURED, busy=busy, gap_us=gap_us)


SUSTAINED = RegimeSpec()


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text!r:.20} is not a finite number")
    return value


def _quantity(text: str, unit: str) -> float:
    """`200us` (or `200`) in `unit`; ValueError for another unit or not a number."""
    match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([A-Za-z]*)\s*", text)
    if match is None or match.group(2) not in ("", unit):
        raise ValueError(f"{text!r:.20} is not a number of {unit}")
    return _number(match.group(1))


@dataclasses.dataclass(frozen=True)
class RegimePlan:
    """What one timing block of a regime enqueues, per side: `calls` timed calls in runs of
    `run` back to back, each run followed by a copy of `copy_bytes` (none where 0) and then an
    idle spin of `gap_us` (none where 0). Only the calls are timed (an event pair each)."""

    calls: int
    run: int = 1
    copy_bytes: int = 0
    gap_us: float = 0.0

    @property
    def runs(self) -> int:
        return self.calls // self.run


def plan(spec: RegimeSpec, call_ms: float, *, copy_ms_per_mib: float, block_ms: float) -> RegimePlan:
    """The block of `spec` for a call of about `call_ms` (not SUSTAINED, which `time_sustained`
    times as it always did).

    Args:
        spec: the regime.
        call_ms: one call's time, estimated back to back.
        copy_ms_per_mib: the copy's time per MiB on this GPU (AS_CAPTURED's filler is sized by it).
        block_ms: about how long a block lasts, gaps and copies included.

    Returns:
        The block's plan: whole runs, at least one.

    Raises:
        ValueError: `spec` is SUSTAINED or IN_MODEL, or a time that is not positive.
    """
    if spec.regime is Regime.SUSTAINED:
        raise ValueError("the sustained regime is timed by time_sustained")
    if not spec.regime.in_bench:
        raise ValueError(f"regime {spec.name} is measured by tune-model, not planned by the bench")
    if call_ms <= 0 or copy_ms_per_mib <= 0 or block_ms <= 0:
        raise ValueError("call_ms, copy_ms_per_mib and block_ms must be positive")
    run, copy_mib = 1, spec.copy_mib
    if spec.regime is Regime.AS_CAPTURED:
        # busy = B / (B + gap): the busy time B between two gaps, made of whole calls and a copy.
        busy_ms = spec.busy * spec.gap_us / 1000 / (1 - spec.busy)
        run = max(1, math.floor(busy_ms / call_ms + 1e-9))
        copy_mib = max(0.0, busy_ms - run * call_ms) / copy_ms_per_mib
    copy_bytes = round(copy_mib * (1 << 20) / 16) * 16
    cycle_ms = run * call_ms + copy_bytes / (1 << 20) * copy_ms_per_mib + spec.gap_us / 1000
    runs = max(1, math.ceil(block_ms / cycle_ms))
    return RegimePlan(calls=runs * run, run=run, copy_bytes=copy_bytes, gap_us=spec.gap_us)


def spin_cycles(gap_us: float, cycles_per_us: float) -> int:
    """Clock cycles of a one-thread spin that idles the GPU for `gap_us` at the measured rate
    (`torch.cuda._sleep` counts cycles: its length in time follows the clock)."""
    return max(1, round(gap_us * cycles_per_us)) if gap_us > 0 else 0
