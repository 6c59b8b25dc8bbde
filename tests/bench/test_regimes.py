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
    kept = _regimes._enqueue(lambda: log.append("call"), p, lambda n: log.append(f"copy {n}"), 5000,
                             _regimes._Headroom(1000.0))
    one_run = ["event", "call", "event"] * 2 + ["copy 1024", "spin 5000"]
    assert log == one_run * 2
    assert len(kept) == 4


def test_an_untimed_block_records_no_event(monkeypatch):
    log = _fakes(monkeypatch)
    p = RegimePlan(calls=3, run=1, gap_us=10.0)
    assert _regimes._enqueue(lambda: log.append("call"), p, lambda n: None, 7, None) == []
    assert log == ["call", "spin 7"] * 3


def test_a_call_the_gpu_waited_for_is_dropped(monkeypatch):
    """Guards against host launch time inside a kept sample: a call whose opening event the GPU
    had already passed when it was enqueued."""
    log = _fakes(monkeypatch, passed=lambda i: i == 2)  # the second call's opening event
    p = RegimePlan(calls=3, run=1)
    headroom = _regimes._Headroom(1000.0)
    kept = _regimes._enqueue(lambda: log.append("call"), p, lambda n: None, 0, headroom)
    assert len(kept) == 2 and not any(s.passed for s, _ in kept) and headroom.dropped == 1
    # the call after the dropped one waits behind a spin, outside its events
    assert log == ["event", "call", "event", "event", "call", "event", log[6], "event", "call", "event"]
    assert log[6].startswith("spin ") and int(log[6].split()[1]) >= _regimes.HEADROOM_MIN_US * 1000


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


class _Gpu:
    """A host and a GPU on the CPU, in milliseconds: the host's clock moves by each operation's
    host cost; the GPU runs what was enqueued in order, each operation starting once the host has
    enqueued it and the GPU is free. An event's time is when the GPU reaches it."""

    EVENT_MS, SPIN_MS, COPY_MS_PER_MIB = 0.002, 0.004, 0.0005

    def __init__(self):
        self.host = self.free = 0.0
        self.after_gap = False

    def enqueue(self, host_ms, gpu_ms):
        self.host += host_ms
        start = max(self.host, self.free)
        self.free = start + gpu_ms
        return start

    def launch(self, host_ms, gpu_ms):
        self.enqueue(host_ms, gpu_ms)
        self.after_gap = False

    def synchronize(self):
        self.host = max(self.host, self.free)

    def event(self):
        gpu = self

        class Event:
            def record(self):
                self.t = gpu.enqueue(gpu.EVENT_MS, 0.0)

            def query(self):
                return self.t <= gpu.host

            def elapsed_time(self, end):
                return end.t - self.t

        return Event()

    def spin(self, cycles):  # 1000 cycles a microsecond
        self.enqueue(self.SPIN_MS, cycles / 1e6)
        self.after_gap = True

    def estimate(self, call):  # as `_estimate_ms`: one call, then five back to back
        call()
        self.synchronize()
        begun = self.host
        for _ in range(5):
            call()
        self.synchronize()
        return (self.free - begun) / 5


def _simulated(monkeypatch):
    from cutlass_tune.bench._timing import Reading

    gpu = _Gpu()

    class Filler:
        ms_per_mib = gpu.COPY_MS_PER_MIB

        def __init__(self, spec):
            pass

        def size(self, nbytes):
            pass

        def __call__(self, nbytes):
            if nbytes:
                gpu.launch(gpu.SPIN_MS, nbytes / (1 << 20) * gpu.COPY_MS_PER_MIB)

    class Clock:
        @staticmethod
        def perf_counter():
            return gpu.host / 1000

    monkeypatch.setattr(_regimes, "_new_event", gpu.event)
    monkeypatch.setattr(_regimes, "_spin", gpu.spin)
    monkeypatch.setattr(_regimes, "_estimate_ms", gpu.estimate)
    monkeypatch.setattr(_regimes, "_Filler", Filler)
    monkeypatch.setattr(_regimes, "time", Clock)
    monkeypatch.setattr(_regimes, "_cycles_per_us", lambda: 1000.0)
    monkeypatch.setattr(_regimes, "_window_power", lambda block, ms, probe: block() or 500.0)
    monkeypatch.setattr(_regimes.torch.cuda, "synchronize", gpu.synchronize)
    return gpu, (lambda: Reading(sm_mhz=1000))


OPTIONS = TimingOptions(budget_ms=300, min_samples=3, max_samples=3, method=TimingMethod.SUSTAINED)


def test_a_side_of_many_launches_that_the_host_enqueues_slower_than_the_gpu_runs_is_timed(monkeypatch):
    """Guards against the grouped decode problem's torch side failing in `interleaved:64MiB`:
    torch's expert loop (128 launches, 15 us of host time and 8 us of GPU time each) fell behind,
    every call was dropped and the measurement raised; a spin after a drop lets the host get
    ahead, and the kept calls hold the loop's GPU time alone."""
    gpu, probe = _simulated(monkeypatch)

    def kernel():
        gpu.launch(0.01, 0.5)

    def loop():
        for _ in range(128):
            gpu.launch(0.015, 0.008)

    ours, theirs = _regimes.time_regime([[kernel], [loop]], RegimeSpec.parse("interleaved:64MiB"), options=OPTIONS,
                                        probe=probe)
    assert ours.median_ms == pytest.approx(0.5) and theirs.median_ms == pytest.approx(128 * 0.008)
    assert theirs.dropped > 0 and theirs.samples == 3
    assert ours.dropped <= ours.samples  # at most the first call of a block, enqueued on an idle GPU


def test_a_side_whose_events_hold_the_gap_raises_instead_of_giving_a_ratio(monkeypatch):
    """Guards against `check --regime idle-gap:200us` reading torch's 28.6 us GEMM at 341 us a call
    (ratio 11.9): a side timed in the regime far slower than back to back is an error that names
    both figures, never a ratio."""
    gpu, probe = _simulated(monkeypatch)

    def kernel():
        gpu.launch(0.005, 0.0286)

    def held():  # back to back 28.6 us; after a gap its events hold 312.5 us more
        gpu.launch(0.005, 0.0286 + (0.3125 if gpu.after_gap else 0.0))

    with pytest.raises(RuntimeError, match=r"idle-gap:200us: torch \(cuBLAS\): 341\.1 us a call against 29\.6 us "
                       r"back to back, more than 2x"):
        _regimes.time_regime([[kernel], [held]], RegimeSpec.parse("idle-gap:200us"), options=OPTIONS, probe=probe,
                             names=["matmul", "torch (cuBLAS)"])
    ours, theirs = _regimes.time_regime([[kernel], [kernel]], RegimeSpec.parse("idle-gap:200us"), options=OPTIONS,
                                        probe=probe)
    assert ours.median_ms == pytest.approx(0.0286) and theirs.median_ms == pytest.approx(0.0286)
