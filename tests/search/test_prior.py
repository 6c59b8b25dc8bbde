"""The prior (search/_prior.py, _features.py) and the strategy it leads (_prior_strategy.py), on a CPU."""

import logging
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optuna
import pytest

from cutlass_tune.measurement import TimingMethod
from cutlass_tune.search import Sweep, SweepSettings
from cutlass_tune.search import _prior as prior_module
from cutlass_tune.search._features import FEATURES, Pool, auto_columns, config_columns, features
from cutlass_tune.search._prior import (
    COMMITTED,
    Observation,
    Prior,
    StoreObservations,
    committed_frame,
    committed_observations,
    diverse_order,
)
from cutlass_tune.search._prior_strategy import PriorStrategy, load_committed
from cutlass_tune.space import (
    AutoKernels,
    KernelConfig,
    KernelSchedule,
    Operation,
    Problem,
    TileScheduler,
    check_config,
    space_for_shapes,
)
from cutlass_tune.store import ResultStore

from .fakes import FakeBench, FakeCompiler, record, space_of

REPO = Path(__file__).resolve().parents[2]
BF16 = Operation()
SMALL = {"tile_m": (64, 128, 256), "tile_n": (64, 128, 160, 192, 256), "cluster": ((1, 1), (2, 1)),
         "stages": (0, 4), "tile_k": (64,), "epilogue_tile_n": (0,)}


def feature(problem, cfg, name, sm_count=132):
    return features(problem, config_columns([cfg]), sm_count)[0, FEATURES.index(name)]


def test_wave_quantization_per_schedule():
    problem = Problem(4096, 4096, 4096)
    coop = KernelConfig.for_operation(BF16)  # 128x128 cooperative: 1024 tiles on 132 SMs, 8 waves, the last 76% full
    assert feature(problem, coop, "waves") == pytest.approx(1024 / 132)
    assert feature(problem, coop, "wave_fill") == pytest.approx(1024 / (8 * 132))
    pingpong = KernelConfig.for_operation(BF16, kernel_schedule=KernelSchedule.PINGPONG,
                            epilogue_schedule=coop.epilogue_schedule.TMA)  # two tiles at a time per SM
    assert feature(problem, pingpong, "slots") == 264 and feature(problem, pingpong, "wave_fill") == pytest.approx(
        1024 / (4 * 264))
    clustered = KernelConfig.for_operation(BF16, cluster_m=4, cluster_n=2)  # 16 clusters of 8 keep 128 SMs busy
    assert feature(problem, clustered, "slots") == 128
    stream_k = KernelConfig.for_operation(BF16, tile_scheduler=TileScheduler.STREAM_K)
    assert feature(problem, stream_k, "stream_k_fill") == pytest.approx(1024 * 64 / (497 * 132))
    skinny = Problem(4096, 1280, 8192)  # 128x160 tiles: 32 x 8 = 256 tiles, 97% of two waves
    tile = KernelConfig.for_operation(BF16, tile_n=160)
    assert feature(skinny, tile, "wave_fill") == pytest.approx(256 / 264)
    assert feature(Problem(100 * 8, 256, 256), KernelConfig.for_operation(BF16), "pad_m") == pytest.approx(800 / 896)


def test_auto_columns_are_the_configs_columns():
    """Guards the prior's fast path over an auto kind against describing configs otherwise."""
    auto = AutoKernels(BF16, SMALL)
    cols, chosen = auto_columns(auto)
    rows = random.Random(0).sample(range(len(auto)), 50)
    direct = config_columns([auto.config_of(chosen[r].tolist()) for r in rows])
    for name, values in direct.items():
        assert np.array_equal(cols[name][rows], values), name
    assert [auto.config_of(c.tolist()) for c in chosen[:20]] == list(auto)[:20]
    assert [tuple(c) for c in chosen.tolist()] == list(auto.all_value_indices())  # built from the walk's graph


def test_diverse_order_takes_each_group_best_first():
    scores = np.array([0.9, 0.8, 0.7, 0.1, 0.5])
    groups = np.array([0, 0, 1, 1, 2])
    assert diverse_order(scores, groups).tolist() == [0, 2, 4, 1, 3]


def test_committed_configs_read_back_with_their_hashes():
    """Guards the table's reading (floats, flags, enum spellings) against building other configs."""
    frame = committed_frame()
    sample = frame.drop_duplicates("config_hash").head(400)
    for row in sample.to_dict("records"):
        problem = prior_module._problem_of(row)
        assert prior_module._config_of(row, problem).hash == row["config_hash"]


def test_the_committed_observations_fit_in_seconds():
    """Slow: fits the prior on every committed H200 measurement and ranks a whole 16-bit kind: the time is the claim."""
    observations = committed_observations(committed_frame(), "NVIDIA H200", "events")
    assert len({o.problem for o in observations}) >= 70 and all(o.ratio for o in observations)
    start = time.monotonic()
    prior = Prior.fit(observations, 132)
    assert time.monotonic() - start < 30  # about a second on two cores
    pool = Pool.of_auto(AutoKernels(BF16))
    start = time.monotonic()
    ranked = prior.rank(Problem(4096, 1280, 8192), pool)
    assert time.monotonic() - start < 10
    top = [pool.config(r) for r in ranked[:8]]
    assert all(not check_config(c) for c in top)
    assert len({(c.tile_m, c.tile_n, c.kernel_schedule) for c in top}) == 8  # eight kernel shapes


def test_the_prior_learns_what_wins():
    """On synthetic results where 2x1 clusters and wide tiles win, the prior fitted on other
    problems puts such a config first for a problem it has not seen."""
    auto = AutoKernels(BF16, SMALL)
    configs = list(auto)

    def truth(problem, cfg):
        return 0.6 + 0.2 * (cfg.cluster_m == 2) + 0.001 * cfg.tile_n + 0.05 * (cfg.stages == 0)

    problems = [Problem(m, n, 4096) for m in (2048, 4096, 8192) for n in (2048, 4096)]
    seen = [Observation(p, c, truth(p, c)) for p in problems[1:] for c in configs]
    prior = Prior.fit(seen, 132)
    pool = Pool.of_configs(configs)
    first = pool.config(prior.rank(problems[0], pool, diverse=False)[0])
    assert first.cluster_m == 2 and first.tile_n == 256 and first.stages == 0
    # knob values outside those fitted pay for the extrapolation: tile N 16 (SMALL's are 64-256)
    # and the 16-column epilogue subtile CUTLASS picks for it (32 for all of SMALL's)
    narrow, wide = KernelConfig.for_operation(BF16, tile_n=16), KernelConfig.for_operation(BF16, tile_n=64)
    cols = config_columns([narrow, wide])
    raw = prior.model.predict(features(problems[0], cols, 132))
    assert (prior.score(problems[0], cols) - raw).tolist() == pytest.approx([2 * prior_module.OUTSIDE_PENALTY, 0])
    unfitted = Prior(132)  # no observations: by the share of useful work alone
    assert unfitted.model is None and len(unfitted.rank(problems[0], pool)) == len(pool)


def test_store_observations_are_read_a_part_at_a_time(tmp_path):
    space = space_of(tmp_path, "problems: [{m: 1024, n: 1024, k: 1024}]\nkernels: {tile_n: [64, 128]}\n")
    store = ResultStore(f"sqlite:///{tmp_path / 'store.sqlite'}")
    observed = StoreObservations(store)
    assert observed.update() == []
    first, second = space.candidates
    record(store, space, first)
    got = observed.update()
    assert [(o.config, round(o.ratio, 6)) for o in got] == [(first, round(max(
        r.ratio for r in store.rows() if r.config_hash == first.hash), 6))]
    record(store, space, second, bench=FakeBench(wrong_tile_m=128))  # a wrong result: failed
    got = observed.update()
    assert len(got) == 2 and got[1].ratio is None


def test_the_prior_logs_what_it_was_fitted_on(caplog):
    # Regression: nothing said which file, GPUs and operations the prior learnt from (or that it
    # learnt from none), so a wheel that had lost the table fitted on an empty store unseen.
    with caplog.at_level(logging.INFO, logger="cutlass_tune.search._prior_strategy"):
        observations = load_committed("NVIDIA H200", TimingMethod.EVENTS)
    plain, grouped = [r.getMessage() for r in caplog.records]
    assert plain.startswith(f"prior's committed measurements (GEMMs): {COMMITTED}, ")
    assert grouped.startswith(f"prior's committed measurements (grouped GEMMs): {COMMITTED}, ")
    pairs = [int(line.split(" config-problem pairs")[0].rsplit("(", 1)[1]) for line in (plain, grouped)]
    assert sum(pairs) == len(observations) and pairs[1] == sum(o.problem.grouped for o in observations) > 0
    assert all(" of NVIDIA H200, timed by events; " in line for line in (plain, grouped))
    assert "bf16bf16bf16_tn" in plain.split("operations ")[1]
    assert "bf16bf16bf16_tn_grouped" in grouped.split("operations ")[1]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cutlass_tune.search._prior_strategy"):
        load_committed("NVIDIA B200", TimingMethod.EVENTS)
    assert "(none of NVIDIA B200, so every GPU's)" in caplog.text


def test_a_missing_table_is_warned_of(no_committed, caplog):
    assert load_committed("NVIDIA H200", TimingMethod.EVENTS) == []
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "the prior learns from this store alone" in caplog.text


def test_importing_the_search_stage_leaves_sklearn_out():
    code = "import cutlass_tune.search, sys; print('sklearn' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.strip() == "False"


@pytest.fixture
def no_committed(monkeypatch, tmp_path):
    """The prior learns from the sweep's store alone (as where the committed table is missing)."""
    monkeypatch.setattr(prior_module, "COMMITTED", tmp_path / "missing.csv.gz")
    assert COMMITTED.is_file()


def sweep(space, tmp_path, **settings):
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    store = ResultStore(url)
    compiler, bench = FakeCompiler(), FakeBench()
    run = Sweep(space, store, url, compiler, bench, SweepSettings(**{"trials": 12, "batch": 4, **settings}))
    return run, run.run(), [c for call in compiler.calls for c in call], store


def test_an_auto_sweep_is_led_by_the_prior_beyond_the_hand_written_lists(tmp_path, no_committed):
    """Slow: a kernels: auto sweep of two problems, refitted as results come (the behaviour under test)."""
    space = space_for_shapes("4096x1280x8192,2048x4096x4096")
    run, state, compiled, store = sweep(space, tmp_path)
    assert isinstance(run.strategy, PriorStrategy) and run.strategy.fits >= 2  # at the start, then refitted
    assert state.stop_reason == "trial budget reached" and len(compiled) == len({c.hash for c in compiled}) == 12
    assert all(not check_config(c) and space.holds(c) for c in compiled)
    # wave-fitting tiles no hand-written list holds, such as tile N 160, come from the prior
    assert any(c.tile_n not in (64, 128, 256) for c in compiled)
    for pp in state.problems:
        assert len([t for t in pp.study.trials if t.state is optuna.trial.TrialState.COMPLETE]) == 12
        assert pp.best_ratio is not None
    # each study's first trial is the prior's first pick for its problem (here, before any
    # result, by the share of useful work alone), or its second where the first was another
    # problem's first too, and awaited for it
    for pp in state.problems:
        pool = run.strategy._pool(pp.problem)
        first_picks = [pool.config(r).hash for r in Prior(132).rank(pp.problem, pool)[:2]]
        assert pp.study.trials[0].user_attrs["config_hash"] in first_picks


def test_a_sweep_resumed_with_the_prior_repeats_nothing(tmp_path, no_committed):
    space = space_for_shapes("2048x2048x2048")
    _, _, first, _ = sweep(space, tmp_path, trials=4)
    _, state, second, _ = sweep(space, tmp_path, trials=8)
    assert len(first) == 4 and len(second) == 4 and not {c.hash for c in first} & {c.hash for c in second}
    assert state.compiled == 8


def test_the_prior_keeps_to_a_space_of_lists(tmp_path, no_committed):
    space = space_of(tmp_path, "problems: [{m: 4096, n: 1280, k: 8192}]\nkernels: {tile_n: [64, 128, 256], "
                               "tile_m: [64, 128, 256], kernel_schedule: [cooperative, pingpong]}\n")
    run, state, compiled, _ = sweep(space, tmp_path, strategy="prior", trials=5)
    assert isinstance(run.strategy, PriorStrategy)
    assert compiled and all(space.holds(c) for c in compiled)


def test_optuna_stays_the_default_for_lists_and_can_sweep_auto(tmp_path, no_committed):
    lists = space_of(tmp_path, "problems: [{m: 1024, n: 1024, k: 1024}]\nkernels: {tile_n: [64, 128]}\n")
    run, _, _, _ = sweep(lists, tmp_path, trials=2)
    assert not isinstance(run.strategy, PriorStrategy)
    auto = space_for_shapes("1024x1024x1024")
    run, state, compiled, _ = sweep(auto, tmp_path / "auto", strategy="optuna", trials=6)
    assert not isinstance(run.strategy, PriorStrategy) and len(compiled) == 6
    assert all(not check_config(c) for c in compiled)


def test_grid_sampling_of_auto_is_refused(tmp_path):
    from cutlass_tune.errors import CutlassTuneError

    with pytest.raises(CutlassTuneError, match="grid sampler cannot walk"):
        sweep(space_for_shapes("1024x1024x1024"), tmp_path, strategy="optuna", sampler="grid")


def test_the_prior_learns_plain_gemms_only_from_the_committed_measurements():
    # A fused problem's ratio is to torch eager; fitted as a plain GEMM's it would mislead.
    from cutlass_tune.search._prior import committed_frame, committed_observations

    frame = committed_frame()
    assert (frame["epilogue"].fillna("none") != "none").any()  # the committed table holds fused rows
    observations = committed_observations(frame, gpu="NVIDIA H100 80GB HBM3")
    assert observations and all(o.config.epilogue.is_plain and o.config.scaling.value == "none"
                                for o in observations)


def test_each_problem_of_an_auto_space_is_ranked_from_the_configs_of_its_own_operation(tmp_path, no_committed):
    """Guards against pooling by types and layouts alone: a plain and a bias+silu 4096^3 GEMM
    shared one pool, 0 of the fused problem's picks were in its study, and it fell back to TPE."""
    space = space_of(tmp_path, "problems: [{m: 4096, n: 4096, k: 4096}, "
                               "{m: 4096, n: 4096, k: 4096, epilogue: bias+silu}]\nkernels: auto\n")
    plain, fused = space.problems
    assert plain.operation != fused.operation and plain.name != fused.name
    run, state, compiled, _ = sweep(space, tmp_path, trials=8, batch=4)
    strategy = run.strategy
    assert isinstance(strategy, PriorStrategy)
    for s in run.studies:
        picks = strategy.picks(s, 512)
        assert picks and all(c.operation == s.problem.operation and s.params.has(c) for c in picks)
    assert {c.operation for c in compiled} == {plain.operation, fused.operation}
    for pp in state.problems:  # each study's first trial is one of the prior's picks for it
        first = pp.study.trials[0].user_attrs["config_hash"]
        study = next(s for s in run.studies if s.problem == pp.problem)
        assert first in {c.hash for c in strategy.picks(study, 4)}


def test_an_activation_s_problem_is_led_by_the_ping_pong_tile_that_led_every_fused_shape(tmp_path, no_committed):
    """Slow: walks the bias+gelu kind its sweep ranks (seconds; no other test has it)."""
    # Guards the epilogue-gap finding (benchmarks/epilogue_gap.md): ping-pong 128x128 led all 24
    # bias+activation problems; a prior without that evidence (here, fitted on nothing) picked other
    # tiles first and never reached it in 4 configs.
    from cutlass_tune.search._seeds import fused_defaults

    space = space_for_shapes("4096x14336x4096,4096x4096x4096", epilogue="bias+gelu")
    space_plain = space_for_shapes("4096x4096x4096")
    _, state, compiled, _ = sweep(space, tmp_path, trials=4, batch=4)
    for pp in state.problems:
        first = fused_defaults(pp.problem, space)
        assert [(c.tile_m, c.tile_n, c.kernel_schedule.value) for c in first] == [(128, 128, "pingpong")]
        assert first[0].hash in {t.user_attrs["config_hash"] for t in pp.study.trials}
    assert compiled[0] == fused_defaults(state.problems[0].problem, space)[0]  # compiled first
    assert fused_defaults(space_plain.problems[0], space_plain) == []
