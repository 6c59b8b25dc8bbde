"""A store's in-model figures (`tune-model --storage`): recorded in one transaction, read back by
`best`, `load_candidates` and `BestTable.load` with the kernel fastest in the model chosen, as
`tune-model --out` writes it. The profiled steps are recorded kernel times (no GPU)."""

import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from cutlass_tune import BestTable, load_best
from cutlass_tune.measurement import Measurement
from cutlass_tune.regime import RegimeSpec
from cutlass_tune.report import build_dashboard, load_candidates
from cutlass_tune.runtime import Call, FallbackReason, Kind, _dispatch, resolve
from cutlass_tune.search._in_model import (
    TORCH,
    InModelRun,
    choose,
    covered,
    in_model_measurements,
    record,
    schedule,
    stored_variants,
    tuned_frame,
)
from cutlass_tune.space import RuntimeArgs
from cutlass_tune.status import Status
from cutlass_tune.store import TUNE_MODEL_STUDY, ResultStore

from ..cli_run import cli
from ..search.test_confirm import BIG, COOP, PINGPONG, PLAIN, SMALL, baseline, kernel

GPU = "NVIDIA H200"
COMPILED = "in-model:compiled:4096"
SCHEMA1 = Path(__file__).resolve().parents[1] / "store" / "data" / "store-schema1.sqlite"


@pytest.fixture
def store(tmp_path):
    """A swept store: on BIG PINGPONG 1.05, COOP 1.03, PLAIN 0.90 (the sweep ranks PINGPONG
    first); on SMALL PLAIN 1.01, COOP 0.98."""
    s = ResultStore(f"sqlite:///{tmp_path / 'store.sqlite'}")
    s.bind_gpu(GPU)
    for problem, cfg, ratio in ((BIG, PINGPONG, 1.05), (BIG, COOP, 1.03), (BIG, PLAIN, 0.90), (SMALL, PLAIN, 1.01),
                                (SMALL, COOP, 0.98)):
        s.add(baseline(problem), gpu=GPU, run_id="sweep", study=f"study-{problem.name}")
        s.add(kernel(problem, cfg, RuntimeArgs(), ratio), gpu=GPU, run_id="sweep", cublas_tflops=600.0,
              study=f"study-{problem.name}")
    return s


def tune(store, us, *, regime=COMPILED, sm_mhz=1755.0, power_w=610.0, rounds=3, calls=2, problems=(BIG, SMALL)):
    """What `tune-model --storage` does after its profiled steps, on recorded kernel times: `us`,
    per problem name, each candidate's microseconds a call by kernel name (TORCH for torch's path),
    +-1 by round, `calls` calls a step. Returns the choices and the table tune-model read."""
    table = BestTable.load(store.url)
    found = covered(table, problems, load_candidates(store.url, 3), 3)
    one = schedule(found)
    steps = one * rounds
    times = {i: {p: calls * (us[p][c.label.split()[0]] + (i // len(one) % 3 - 1)) for p, c in step.items()}
             for i, step in enumerate(steps)}
    counts = {i: {p: calls for p in step} for i, step in enumerate(steps)}
    choices = choose(found, steps, times, calls=counts, run=InModelRun(RegimeSpec.parse(regime), sm_mhz, power_w))
    record(store, in_model_measurements(choices, stored_variants(store)), GPU)
    return choices, table


def in_model_us(big, small):
    return {BIG.name: {TORCH: 100.0, **big}, SMALL.name: {TORCH: 100.0, **small}}


def test_best_of_the_store_takes_the_kernel_fastest_in_the_model_with_its_regime(store):
    """The sweep ranks PINGPONG first on BIG; in the model COOP is fastest: the store's table holds
    COOP with torch's time over its own, the regime, the SM clock and the power."""
    choices, table = tune(store, in_model_us({PINGPONG.name: 95.0, COOP.name: 80.0, PLAIN.name: 99.0},
                                             {PLAIN.name: 90.0, COOP.name: 97.0}))
    best = load_best(store.url).set_index("problem")
    big = best.loc[BIG.name]
    assert (big["kernel"], big["ratio"]) == (COOP.name, pytest.approx(1.03))  # the row's own claim stays
    assert big["in_model_ratio"] == pytest.approx(100 / 80)
    assert (big["in_model_regime"], big["in_model_sm_mhz"], big["in_model_power_w"]) == (COMPILED, 1755.0, 610.0)
    assert best.loc[SMALL.name, "in_model_ratio"] == pytest.approx(100 / 90)
    # exactly the rows `tune-model --out` writes from the same choices
    out = tuned_frame(table.frame, choices).set_index("problem")
    columns = ["kernel", "config_hash", "runtime", "ratio", "in_model_regime", "in_model_ratio", "in_model_sm_mhz",
               "in_model_power_w"]
    pd.testing.assert_frame_equal(best.loc[out.index, columns], out[columns], check_dtype=False)
    # the dispatcher decides on it, and a later tune-model starts from it (the store's leading candidate)
    match = BestTable.load(store.url).lookup(4096, 4096, 4096)
    ratio, source = match.dispatch_ratio()
    assert ratio == pytest.approx(1.25) and source.startswith(f" inside the model ({COMPILED}) (its claim 1.030)")
    leading = load_candidates(store.url, 3)
    assert list(leading[leading["problem"] == BIG.name]["kernel"]) == [COOP.name, PINGPONG.name, PLAIN.name]


def test_the_store_holds_each_candidates_time_a_call_beside_torchs(store):
    before = len(store.rows())
    tune(store, in_model_us({PINGPONG.name: 95.0, COOP.name: 80.0, PLAIN.name: 99.0},
                            {PLAIN.name: 90.0, COOP.name: 97.0}), calls=4)
    rows = store.rows()[before:]
    assert {(r.study, r.regime) for r in rows} == {(TUNE_MODEL_STUDY, COMPILED)} and len({r.run_id for r in rows}) == 1
    by = {(r.problem, r.kernel): r for r in rows}
    coop = by[(BIG.name, COOP.name)]
    assert coop.median_ms == pytest.approx(0.080) and coop.ratio == pytest.approx(100 / 80)  # a call, not a step
    assert by[(BIG.name, "cuBLAS")].median_ms == pytest.approx(0.100) and by[(BIG.name, "cuBLAS")].ratio is None
    assert len(rows) == 3 + 1 + 2 + 1  # BIG's three kernels and torch, SMALL's two and torch
    m = [r for r in store.rows(["record"]) if r.id == coop.id][0].measurement()
    assert (m.sm_mhz, m.power_w, m.regime, m.samples) == (1755.0, 610.0, COMPILED, 3)


def test_torch_faster_in_the_model_keeps_the_kernel_off_under_min_ratio(store, monkeypatch):
    """Where torch's path was faster in the model, the row is the fastest kernel's with its ratio
    below 1: the dispatcher keeps torch's path, as for `tune-model --out`'s table."""
    tune(store, in_model_us({PINGPONG.name: 95.0, COOP.name: 80.0, PLAIN.name: 99.0},
                            {PLAIN.name: 110.0, COOP.name: 125.0}))
    small = load_best(store.url).set_index("problem").loc[SMALL.name]
    assert (small["kernel"], small["in_model_ratio"]) == (PLAIN.name, pytest.approx(100 / 110))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: GPU)
    monkeypatch.setattr(_dispatch, "_warned", set())
    call = Call(Kind.DENSE, SMALL, 0, 1.0, ("small",))
    with pytest.warns(RuntimeWarning, match=rf"0\.909x torch inside the model \({COMPILED}\)"):
        plan = resolve(BestTable.load(store.url), call)
    assert plan.kernel is None and plan.fallback.reason is FallbackReason.BELOW_MIN_RATIO


def test_the_last_run_chooses_and_a_kernel_found_wrong_since_never_does(store):
    tune(store, in_model_us({PINGPONG.name: 95.0, COOP.name: 80.0, PLAIN.name: 99.0},
                            {PLAIN.name: 90.0, COOP.name: 97.0}))
    tune(store, in_model_us({PINGPONG.name: 85.0, COOP.name: 90.0, PLAIN.name: 99.0},
                            {PLAIN.name: 90.0, COOP.name: 97.0}), regime="in-model:graphs:1", sm_mhz=1980.0)
    big = load_best(store.url).set_index("problem").loc[BIG.name]
    assert (big["kernel"], big["in_model_regime"], big["in_model_sm_mhz"]) == (PINGPONG.name, "in-model:graphs:1",
                                                                               1980.0)
    assert big["in_model_ratio"] == pytest.approx(100 / 85)
    # a wrong result of PINGPONG since (any run-time variant): the run's next fastest, never PINGPONG
    store.add(kernel(BIG, PINGPONG, RuntimeArgs(swizzle=2), 1.0, Status.WRONG_RESULT), gpu=GPU, run_id="confirm")
    big = load_best(store.url).set_index("problem").loc[BIG.name]
    assert (big["kernel"], big["in_model_ratio"]) == (COOP.name, pytest.approx(100 / 90))


def test_best_and_the_dashboard_show_the_in_model_regime_clock_and_power(store):
    tune(store, in_model_us({PINGPONG.name: 95.0, COOP.name: 80.0, PLAIN.name: 99.0},
                            {PLAIN.name: 90.0, COOP.name: 97.0}))
    said = f"{COMPILED} 1.250 at 1755 MHz 610 W"
    assert said in build_dashboard(store.url)
    r = cli("best", "--storage", store.url)
    assert r.returncode == 0 and said in " ".join(r.stdout.split())


def test_a_store_without_in_model_rows_reads_as_before(store):
    best = load_best(store.url).set_index("problem")
    assert best.loc[BIG.name, "kernel"] == PINGPONG.name
    assert best["in_model_ratio"].isna().all() and set(best["in_model_regime"]) == {""}


def test_a_store_of_the_first_schema_takes_in_model_figures(tmp_path):
    """A store made before migrations: the first in-model record upgrades it, and `best` then
    chooses by the figures."""
    path = tmp_path / "old.sqlite"
    shutil.copy(SCHEMA1, path)
    store = ResultStore(f"sqlite:///{path}")
    assert store.schema() == 1
    problems = sorted({m.problem.name: m.problem for m in store.measurements()}.values(), key=lambda p: p.m)
    before = load_best(store.url).set_index("problem")
    found = covered(BestTable.load(store.url), problems, load_candidates(store.url, 3), 3)
    one = schedule(found)
    kernel_us = {problems[0].name: 200.0, problems[1].name: 50.0}  # torch's 100: faster on the first only
    times = {i: {p: 100.0 if c.is_torch else kernel_us[p] for p, c in step.items()} for i, step in enumerate(one * 2)}
    choices = choose(found, one * 2, times, run=InModelRun(RegimeSpec.parse("in-model:eager")))
    record(store, in_model_measurements(choices, stored_variants(store)), GPU)
    assert store.schema() > 1
    after = load_best(store.url).set_index("problem")
    for problem, ratio in zip(problems, (0.5, 2.0)):
        row = after.loc[problem.name]
        assert (row["kernel"], row["runtime"]) == tuple(before.loc[problem.name, ["kernel", "runtime"]])
        assert (row["in_model_ratio"], row["in_model_regime"]) == (pytest.approx(ratio), "in-model:eager")
        assert row["ratio"] == pytest.approx(before.loc[problem.name, "ratio"])


def test_in_model_rows_are_never_confirm_candidates(store):
    """Guards `confirm` re-measuring a variant because of its in-model ratio (not a sweep's figure)."""
    from cutlass_tune.search import candidates

    before = {(c.problem.name, c.config.hash): c.ratio for c in candidates(store, 3)}
    tune(store, in_model_us({PINGPONG.name: 95.0, COOP.name: 50.0, PLAIN.name: 99.0},
                            {PLAIN.name: 90.0, COOP.name: 97.0}))
    assert {(c.problem.name, c.config.hash): c.ratio for c in candidates(store, 3)} == before


def test_a_choice_without_its_run_or_its_stored_variant_is_refused(store):
    from cutlass_tune.search._in_model import InModelError

    table = BestTable.load(store.url)
    found = covered(table, [BIG], None, 1)
    steps = schedule(found)
    times = {i: {BIG.name: 100.0 - i} for i in range(len(steps))}
    with pytest.raises(InModelError, match="does not say where it ran"):
        in_model_measurements(choose(found, steps, times), stored_variants(store))
    choices = choose(found, steps, times, run=InModelRun(RegimeSpec.parse(COMPILED)))
    with pytest.raises(InModelError, match=f"{BIG.name}: {PINGPONG.name} .* is not in the store"):
        in_model_measurements(choices, {})
    assert isinstance(in_model_measurements(choices, stored_variants(store))[0], Measurement)
