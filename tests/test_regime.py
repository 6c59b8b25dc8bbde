import pytest

from cutlass_tune.errors import CutlassTuneError
from cutlass_tune.regime import (
    DEFAULT_COPY_MIB,
    DEFAULT_GAP_US,
    SUSTAINED,
    Regime,
    RegimeError,
    RegimeSpec,
    StepMode,
    plan,
    spin_cycles,
)


@pytest.mark.parametrize("text,want", [
    ("sustained", RegimeSpec()),
    ("idle-gap:200us", RegimeSpec(Regime.IDLE_GAP, gap_us=200.0)),
    ("idle-gap:50", RegimeSpec(Regime.IDLE_GAP, gap_us=50.0)),
    ("idle-gap", RegimeSpec(Regime.IDLE_GAP, gap_us=DEFAULT_GAP_US)),
    ("interleaved:64MiB", RegimeSpec(Regime.INTERLEAVED, copy_mib=64.0)),
    ("interleaved", RegimeSpec(Regime.INTERLEAVED, copy_mib=DEFAULT_COPY_MIB)),
    ("as-captured:0.7:150us", RegimeSpec.as_captured(0.7, 150.0)),
    ("in-model:compiled:4096", RegimeSpec.in_model(StepMode.COMPILED, 4096)),
    ("in-model:graphs:1", RegimeSpec(Regime.IN_MODEL, mode=StepMode.GRAPHS, tokens=1)),
    ("in-model:eager", RegimeSpec.in_model(StepMode.EAGER)),
])
def test_parse_and_name_round_trip(text, want):
    got = RegimeSpec.parse(text)
    assert got == want
    assert RegimeSpec.parse(got.name) == got


@pytest.mark.parametrize("text", [
    "idle", "sustained:5us", "idle-gap:200ms", "idle-gap:-5us", "idle-gap:0us", "interleaved:0MiB",
    "interleaved:abc", "as-captured:0.7", "as-captured:1.0:100us", "as-captured:0:100us", "idle-gap:nan",
    "as-captured:0.5:0us", "idle-gap:2000000us", "in-model", "in-model:fast:64", "in-model:eager:-1",
    "in-model:eager:1.5", "in-model:eager:64tokens", "in-model:eager:9999999999",
])
def test_bad_spellings_are_one_line_errors(text):
    with pytest.raises(RegimeError) as err:
        RegimeSpec.parse(text)
    assert isinstance(err.value, CutlassTuneError) and "\n" not in str(err.value)


def test_parameters_belong_to_their_regime():
    with pytest.raises(RegimeError):
        RegimeSpec(Regime.SUSTAINED, gap_us=10.0)
    with pytest.raises(RegimeError):
        RegimeSpec(Regime.IDLE_GAP, gap_us=10.0, copy_mib=4.0)
    with pytest.raises(RegimeError):
        RegimeSpec(Regime.INTERLEAVED, copy_mib=4.0, busy=0.5)
    with pytest.raises(RegimeError):
        RegimeSpec(Regime.IN_MODEL)  # without the step's mode
    with pytest.raises(RegimeError):
        RegimeSpec(Regime.IDLE_GAP, gap_us=10.0, mode=StepMode.EAGER)
    with pytest.raises(RegimeError):
        RegimeSpec(Regime.SUSTAINED, tokens=64)


def test_columns_are_identifiers():
    assert [r.column for r in Regime] == ["sustained", "idle_gap", "interleaved", "as_captured", "in_model"]


def test_the_bench_times_every_regime_but_the_in_model_one():
    """Guards against `confirm --regime in-model:...` timing something the bench cannot imitate."""
    assert [r for r in Regime if not r.in_bench] == [Regime.IN_MODEL]
    assert RegimeSpec.parse("idle-gap").for_bench() == RegimeSpec.parse("idle-gap")
    with pytest.raises(RegimeError, match="tune-model") as err:
        RegimeSpec.parse("in-model:compiled:4096").for_bench()
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError):
        plan(RegimeSpec.parse("in-model:eager"), 1.0, copy_ms_per_mib=0.01, block_ms=100.0)


def test_the_step_modes_are_tune_models():
    from cutlass_tune.bench._in_model import Mode

    assert Mode is StepMode and [m.value for m in StepMode] == ["eager", "compiled", "graphs"]


def test_idle_gap_plan_puts_one_gap_after_each_call():
    p = plan(RegimeSpec.parse("idle-gap:200us"), 0.8, copy_ms_per_mib=0.0002, block_ms=100.0)
    assert (p.run, p.copy_bytes, p.gap_us) == (1, 0, 200.0)
    assert p.calls == 100  # 1.0 ms per call and gap in a 100 ms block


def test_interleaved_plan_copies_after_each_call():
    p = plan(RegimeSpec.parse("interleaved:64MiB"), 1.0, copy_ms_per_mib=1 / 64, block_ms=100.0)
    assert (p.run, p.copy_bytes, p.gap_us) == (1, 64 << 20, 0.0)
    assert p.calls == 50  # 1 ms call + 1 ms copy


def test_as_captured_plan_reproduces_the_duty_cycle():
    # busy 0.75 with 100 us gaps: 300 us busy between two gaps; 0.1 ms calls run three at a time
    p = plan(RegimeSpec.as_captured(0.75, 100.0), 0.1, copy_ms_per_mib=0.01, block_ms=10.0)
    assert (p.run, p.copy_bytes, p.gap_us) == (3, 0, 100.0)
    assert p.calls % p.run == 0 and p.runs == 25
    # 0.25 ms calls: one per gap, the 50 us left filled by a copy of 5 MiB at 0.01 ms/MiB
    p = plan(RegimeSpec.as_captured(0.75, 100.0), 0.25, copy_ms_per_mib=0.01, block_ms=10.0)
    assert p.run == 1 and p.copy_bytes == pytest.approx(5 << 20, rel=1e-6)
    busy = p.run * 0.25 + p.copy_bytes / (1 << 20) * 0.01
    assert busy / (busy + 0.1) == pytest.approx(0.75, rel=1e-4)


def test_a_call_longer_than_the_busy_time_still_runs_once_per_gap():
    p = plan(RegimeSpec.as_captured(0.5, 100.0), 2.0, copy_ms_per_mib=0.01, block_ms=100.0)
    assert (p.run, p.copy_bytes) == (1, 0)


def test_plan_refuses_sustained_and_bad_times():
    with pytest.raises(ValueError):
        plan(SUSTAINED, 1.0, copy_ms_per_mib=0.01, block_ms=100.0)
    with pytest.raises(ValueError):
        plan(RegimeSpec.parse("idle-gap"), 0.0, copy_ms_per_mib=0.01, block_ms=100.0)


def test_spin_cycles():
    assert spin_cycles(200.0, 1980.0) == 396_000
    assert spin_cycles(0.0, 1980.0) == 0
