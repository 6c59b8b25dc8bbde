"""The regime timer's block, enqueued on fakes: which calls, copies and gaps, in which order, and
which calls are timed (no GPU)."""

import pytest

from cutlass_tune.bench import TimingOptions, _regimes, regime_options
from cutlass_tune.measurement import TimingMethod
from cutlass_tune.regime import RegimePlan, RegimeSpec


class _Event:
    def __init__(self, log, passed):
        self.log, self.passed = log, passed

    def record(self):
        self.log.append("event")

    def query(self):
        return self.passed


def _fakes(monkeypatch, passed=lambda i: False):
    log = []
    made = []

    def new_event():
        made.append(None)
        return _Event(log, passed(len(made) - 1))

    monkeypatch.setattr(_regimes, "_new_event", new_event)
    monkeypatch.setattr(_regimes, "_spin", lambda cycles: log.append(f"spin {cycles}"))
    return log


def test_a_timed_block_brackets_each_call_and_leaves_copies_and_gaps_outside(monkeypatch):
    log = _fakes(monkeypatch)
    p = RegimePlan(calls=4, run=2, copy_bytes=1024, gap_us=100.0)
    kept = _regimes._enqueue(lambda: log.append("call"), p, lambda n: log.append(f"copy {n}"), 5000, timed=True)
    one_run = ["event", "call", "event"] * 2 + ["copy 1024", "spin 5000"]
    assert log == one_run * 2
    assert len(kept) == 4


def test_an_untimed_block_records_no_event(monkeypatch):
    log = _fakes(monkeypatch)
    p = RegimePlan(calls=3, run=1, gap_us=10.0)
    assert _regimes._enqueue(lambda: log.append("call"), p, lambda n: None, 7, timed=False) == []
    assert log == ["call", "spin 7"] * 3


def test_a_call_the_gpu_waited_for_is_dropped(monkeypatch):
    """Guards against host launch time inside a kept sample: a call whose opening event the GPU
    had already passed when it was enqueued."""
    log = _fakes(monkeypatch, passed=lambda i: i == 2)  # the second call's opening event
    p = RegimePlan(calls=3, run=1)
    kept = _regimes._enqueue(lambda: log.append("call"), p, lambda n: None, 0, timed=True)
    assert len(kept) == 2 and not any(s.passed for s, _ in kept)


def test_a_regime_is_a_setting_of_the_sustained_method():
    spec = RegimeSpec.parse("idle-gap:200us")
    options = regime_options(TimingOptions(), spec)
    assert options.method is TimingMethod.SUSTAINED and options.regime == spec
    with pytest.raises(ValueError, match="sustained method"):
        TimingOptions(method=TimingMethod.EVENTS, regime=spec)


class _Clock:
    """A GPU timeline on the CPU: each call moves it by its side's time; events read it."""

    def __init__(self):
        self.now, self.order = 0.0, []

    def event(self):
        clock = self

        class Event:
            def record(self):
                self.t = clock.now

            def query(self):
                return False

            def elapsed_time(self, end):
                return end.t - self.t

        return Event()


def test_time_regime_alternates_blocks_and_reports_each_sides_time_clock_and_power(monkeypatch):
    from cutlass_tune.bench._timing import Reading

    clock = _Clock()

    def side(name, ms):
        def call():
            clock.now += ms
            clock.order.append(name)
        return call

    class Filler:
        ms_per_mib = 0.01

        def __init__(self, spec):
            pass

        def size(self, nbytes):
            pass

        def __call__(self, nbytes):
            pass

    monkeypatch.setattr(_regimes, "_new_event", clock.event)
    monkeypatch.setattr(_regimes, "_spin", lambda cycles: None)
    monkeypatch.setattr(_regimes, "_estimate_ms", lambda call: 1.0)
    monkeypatch.setattr(_regimes, "_Filler", Filler)
    monkeypatch.setattr(_regimes, "_cycles_per_us", lambda: 1000.0)
    monkeypatch.setattr(_regimes, "_window_power", lambda block, ms, probe: block() or 555.0)
    monkeypatch.setattr(_regimes.torch.cuda, "synchronize", lambda: None)
    options = TimingOptions(budget_ms=400, min_samples=4, max_samples=6, method=TimingMethod.SUSTAINED)
    ours, theirs = _regimes.time_regime([[side("ours", 1.0)], [side("torch", 1.25)]],
                                        RegimeSpec.parse("idle-gap:1000us"), options=options,
                                        probe=lambda: Reading(sm_mhz=1980))
    assert (ours.median_ms, theirs.median_ms) == (1.0, 1.25) and ours.samples == theirs.samples == 4
    assert (ours.sm_mhz, ours.power_w, ours.energy_mj) == (1980, 555.0, 555.0)
    # 50 calls a block (1 ms call + 1 ms gap in 100 ms); the settling blocks, then blocks alternating
    blocks = [clock.order[i] for i in range(0, len(clock.order), 50)]
    assert blocks == ["ours", "torch"] + ["ours", "torch", "torch", "ours"] * 2
