"""Racing a kernel's run-time variants: who gets the full budget, what is kept coarse."""

import dataclasses

import pytest
import torch

from cutlass_tune.bench import Job, RaceOptions, TimingOptions, TimingStats, _runner
from cutlass_tune.bench._race import Entry, contenders, entry, leader_of
from cutlass_tune.bench._runner import GpuRunner
from cutlass_tune.bench._verify import allocate
from cutlass_tune.measurement import METHOD_FACTS, Measurement, TimingMethod
from cutlass_tune.space import Problem, RasterOrder, RuntimeArgs
from cutlass_tune.status import Status

from .test_runner import CpuTarget

P = Problem(64, 48, 32)
RACE = RaceOptions()


def test_variants_within_the_measured_noise_of_the_leader_contend():
    entries = [Entry(1.00, 0.01), Entry(0.98, 0.01), Entry(0.90, 0.01), Entry(None, 0.0)]
    # 0.98 * (1 + 0.01 + 0.01 + 0.02) = 1.019 reaches 1.00; 0.90 * 1.04 = 0.936 does not
    assert contenders(entries, None, RACE) == [0, 1]


def test_wider_brief_samples_keep_more_variants_in_the_race():
    assert contenders([Entry(1.00, 0.10), Entry(0.90, 0.10)], None, RACE) == [0, 1]


def test_a_kernel_far_below_the_problems_best_gets_no_full_budget():
    entries = [Entry(0.80, 0.01), Entry(0.78, 0.01)]
    assert contenders(entries, 1.05, RACE) == []
    assert leader_of(entries, 1.05) == 1.05
    # near the bar, its best variant still contends
    assert contenders(entries, 0.82, RACE) == [0]


def test_a_failed_variant_never_contends():
    assert contenders([Entry(None, 0.0)], None, RACE) == []


def _timed(median, base, spread=0.0, status=Status.OK):
    return Measurement(problem=P, config=None, runtime=RuntimeArgs(), status=status, symbol="ct_x",
                       median_ms=median, p20_ms=median * (1 - spread / 2), p80_ms=median * (1 + spread / 2),
                       samples=5, tflops=P.flops / (median * 1e9), baseline_median_ms=base,
                       baseline_p20_ms=base, baseline_p80_ms=base)


def test_the_score_is_the_paired_ratio_else_tflops_and_the_spread_the_wider_side():
    m = _timed(2.0, 2.5, spread=0.1)
    assert entry(m, paired=True) == Entry(pytest.approx(1.25), pytest.approx(0.1))
    assert entry(m, paired=False).score == pytest.approx(P.flops / 2e9)
    assert entry(dataclasses.replace(m, status=Status.WRONG_RESULT), paired=True).score is None


def test_brief_timing_keeps_the_method_and_pairing_of_the_full_one():
    full = TimingOptions(method=TimingMethod.GRAPH, paired=True, budget_ms=100)
    brief = RACE.brief(full)
    assert (brief.method, brief.paired, brief.budget_ms) == (TimingMethod.GRAPH, True, RACE.budget_ms)


def test_a_race_is_not_run_for_the_baseline_one_variant_without_a_bar_or_sustained_timing():
    two = (RuntimeArgs(raster=RasterOrder.ALONG_M), RuntimeArgs(raster=RasterOrder.ALONG_N))
    kernel = dict(library="/x.so", symbol="ct_x", race=RACE)
    assert Job(problem=P, variants=two, **kernel).races
    assert not Job(problem=P, variants=two[:1], **kernel).races
    assert Job(problem=P, variants=two[:1], bar=1.0, **kernel).races
    assert not Job(problem=P, variants=two, timing=TimingOptions(method=TimingMethod.SUSTAINED), **kernel).races
    assert not Job(problem=P, variants=two, library="/x.so", symbol="ct_x").races
    assert not Job.baseline(P, race=RACE).races


def test_whether_a_method_races_is_its_facts(monkeypatch):
    two = (RuntimeArgs(raster=RasterOrder.ALONG_M), RuntimeArgs(raster=RasterOrder.ALONG_N))
    job = Job(problem=P, variants=two, library="/x.so", symbol="ct_x", race=RACE,
              timing=TimingOptions(method=TimingMethod.GRAPH))
    assert job.races
    facts = dataclasses.replace(METHOD_FACTS[TimingMethod.GRAPH], races=False)
    monkeypatch.setitem(METHOD_FACTS, TimingMethod.GRAPH, facts)
    assert not job.races


class VariantSpeedTarget(CpuTarget):
    """A CPU kernel whose time depends on its variant's swizzle (1: 2 ms, 2: 2.05 ms, 4: 3 ms)."""

    MS = {1: 2.0, 2: 2.05, 4: 3.0}

    def setup(self, variant, ops):
        self.ms = self.MS[variant.swizzle]
        return super().setup(variant, ops)


@pytest.fixture
def runner(monkeypatch):
    budgets = []

    def timing(launches, *, options, flush, prepare):
        budgets.append(options.budget_ms)
        launches[0]()
        ms = runner_target.ms
        return [TimingStats(median_ms=ms, p20_ms=ms * 0.995, p80_ms=ms * 1.005, samples=5),
                TimingStats(median_ms=2.1, p20_ms=2.09, p80_ms=2.11, samples=5)]

    monkeypatch.setattr(_runner, "time_sides", timing)
    r = GpuRunner.__new__(GpuRunner)
    r.env, r._flush, r._ops = None, None, allocate(P, "cpu")
    r._clocks = type("NoClocks", (), {"read": lambda self: None})()
    runner_target = VariantSpeedTarget()
    return r, runner_target, budgets


VARIANTS = tuple(RuntimeArgs(swizzle=s) for s in (4, 1, 2))


def _race(runner, bar=None):
    r, target, budgets = runner
    job = Job(problem=P, variants=VARIANTS, library="/x.so", symbol="ct_x", race=RACE, bar=bar,
              timing=TimingOptions(paired=True, budget_ms=100))
    return list(r._race(job, target, torch.Generator().manual_seed(0))), budgets


def test_only_contenders_get_the_full_budget_and_the_rest_are_kept_coarse(runner):
    found, budgets = _race(runner)
    by = {m.runtime.swizzle: m for m in found}
    assert sorted(by) == [1, 2, 4] and len(found) == 3
    assert by[4].status is Status.COARSE and "cannot reach" in by[4].reason
    assert by[1].status is by[2].status is Status.OK
    assert budgets == [RACE.budget_ms] * 3 + [100, 100]  # three brief timings, two full ones
    assert by[4].paired_ratio is None  # nothing ranks a coarse row
    assert by[4].median_ms == 3.0  # its brief figure is kept


def test_every_variant_is_verified_before_its_time_counts(runner, monkeypatch):
    r, target, _ = runner
    target.mode = "stale"  # right on its first launch, wrong when repeated
    found, _ = _race(runner)
    assert {m.status for m in found} == {Status.WRONG_RESULT}


def test_a_kernel_behind_the_problems_best_is_kept_coarse_whole(runner):
    found, budgets = _race(runner, bar=1.5)
    assert {m.status for m in found} == {Status.COARSE}
    assert budgets == [RACE.budget_ms] * 3
