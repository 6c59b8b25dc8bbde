import pytest

from cutlass_tune.bench import TimingOptions, summarize
from cutlass_tune.bench._timing import percentile, sample_count
from cutlass_tune.measurement import TimingMethod


def test_summary_of_odd_and_even_counts():
    s = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.median_ms, s.p20_ms, s.p80_ms, s.samples) == (3.0, 1.8, 4.2, 5)
    assert summarize([1.0, 2.0, 3.0, 4.0]).median_ms == 2.5


def test_summary_ignores_input_order_and_outliers():
    samples = [1.0] * 9 + [100.0]
    s = summarize(list(reversed(samples)))
    assert s.median_ms == 1.0 and s.p80_ms == 1.0


def test_percentile_matches_numpy_linear():
    values = [0.5, 0.7, 1.0, 1.5, 9.0, 2.0, 0.1]
    ordered = sorted(values)
    expected = {0.0: 0.1, 0.2: 0.54, 0.5: 1.0, 0.8: 1.9, 1.0: 9.0}  # numpy.percentile, linear
    for q, want in expected.items():
        assert percentile(ordered, q) == pytest.approx(want)


def test_single_sample_and_empty():
    s = summarize([0.25])
    assert (s.median_ms, s.p20_ms, s.p80_ms, s.samples) == (0.25, 0.25, 0.25, 1)
    with pytest.raises(ValueError):
        summarize([])


@pytest.mark.parametrize("estimate_ms,expected", [
    (0.001, 1000),  # a tiny kernel is capped
    (1.0, 100),     # 100 ms budget at 1 ms each
    (7.0, 15),      # rounded up
    (50.0, 10),     # a slow kernel still gets the minimum
    (0.0, 1000),    # a zero estimate does not divide by zero
])
def test_sample_count_fills_the_budget_within_bounds(estimate_ms, expected):
    assert sample_count(estimate_ms, TimingOptions()) == expected


def test_timing_options_validate():
    with pytest.raises(ValueError):
        TimingOptions(min_samples=20, max_samples=10)
    with pytest.raises(ValueError):
        TimingOptions(budget_ms=0)
    assert TimingOptions().method == "events" and TimingOptions(method=TimingMethod.GRAPH).method == "graph"
    assert TimingOptions(method=TimingMethod.GRAPH, paired=True).scheme.name == "graph-paired"


class _FakeEvent:
    """Stands in for a CUDA event: `query` says whether the 'GPU' already passed it."""

    def __init__(self, clock, behind):
        self.clock, self.behind, self.t = clock, behind, None

    def record(self):
        self.clock["now"] += 1.0
        self.t = self.clock["now"]

    def query(self):
        return self.behind()

    def elapsed_time(self, other):
        return other.t - self.t


def test_samples_the_host_fell_behind_on_are_dropped_and_a_spin_grows():
    from cutlass_tune.bench._timing import HEADROOM_MAX_CYCLES, HEADROOM_START_CYCLES, _time_interleaved, _Timed

    clock, spins, behind_for = {"now": 0.0}, [], {"kernel": 3, "baseline": 1}
    current = {}

    def target(name):
        def timed():
            current["name"] = name
        return _Timed(timed, timed, None)

    def behind():
        name = current["name"]
        behind_for[name] -= 1
        return behind_for[name] >= 0  # the first few samples of each side: the GPU got there first

    samples, dropped = _time_interleaved(
        5, [target("kernel"), target("baseline")], None,
        new_event=lambda: _FakeEvent(clock, behind), spin=spins.append, synchronize=lambda: None)
    assert [len(s) for s in samples] == [5, 5] and dropped == [3, 1]
    assert all(ms == 1.0 for side in samples for ms in side)
    # One spin after each drop, before the next sample, doubling per drop.
    assert spins == [min(HEADROOM_START_CYCLES * 2 ** i, HEADROOM_MAX_CYCLES) for i in range(4)]


def test_a_host_that_never_gets_ahead_is_an_error_not_a_figure():
    from cutlass_tune.bench._timing import _time_interleaved, _Timed

    noop = _Timed(lambda: None, lambda: None, None)
    clock = {"now": 0.0}
    with pytest.raises(RuntimeError, match="never got ahead"):
        _time_interleaved(3, [noop], None, new_event=lambda: _FakeEvent(clock, lambda: True),
                          spin=lambda c: None, synchronize=lambda: None)
