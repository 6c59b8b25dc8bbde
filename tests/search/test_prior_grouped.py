"""The prior and seeds of grouped (MoE experts) problems: their own, never the plain GEMM's."""

import logging

from cutlass_tune.search._features import FEATURES, config_columns, features
from cutlass_tune.search._prior_strategy import PriorStrategy
from cutlass_tune.search._seeds import GROUPED_DEFAULTS, grouped_defaults, heuristic_configs, seed_configs
from cutlass_tune.space import KernelConfig, KernelSchedule, Problem, Routing, space_for_shapes
from cutlass_tune.store import ResultStore

from .test_prior import no_committed, sweep  # noqa: F401  (a fixture and a helper)


def test_grouped_tiles_along_m_are_each_experts_own():
    plain = Problem(4096, 1536, 2048)
    skewed = Problem.experts(128, 1536, 2048, 4096, routing=Routing.ZIPF)
    cols = config_columns([KernelConfig.for_operation(skewed, tile_m=128)])
    at = FEATURES.index("tiles_m")
    # 128 experts of 32 rows each take a 128-row tile each; one GEMM of 4096 rows takes 32
    assert features(plain, cols, 132)[0, at] == 32
    assert features(Problem.experts(128, 1536, 2048, 4096), cols, 132)[0, at] == 128
    assert features(skewed, cols, 132)[0, at] == sum(-(-r // 128) for r in skewed.group_rows)


def test_grouped_seeds_are_the_hand_picked_grouped_configs_with_no_2x1_cluster(tmp_path, monkeypatch):
    space = space_for_shapes("e128:32768x1536x2048", routing="zipf")
    problem = space.problems[0]
    assert heuristic_configs(problem, "NVIDIA H200") == []  # its model is of one GEMM
    defaults = grouped_defaults(problem, space)
    assert len(defaults) == len(GROUPED_DEFAULTS) and all(c.grouped and space.holds(c) for c in defaults)
    assert [(c.tile_m, c.tile_n, c.kernel_schedule) for c in defaults][:2] == [
        (128, 256, KernelSchedule.COOPERATIVE), (128, 192, KernelSchedule.PINGPONG)]
    assert all((c.cluster_m, c.cluster_n) == (1, 1) for c in defaults)
    store = ResultStore(f"sqlite:///{tmp_path / 's.sqlite'}")
    assert seed_configs(space, store, [problem])[:len(defaults)] == defaults


def test_a_grouped_problem_is_led_by_the_grouped_configs_and_fitted_on_grouped_rows_only(tmp_path, caplog,
                                                                                            no_committed):  # noqa: F811
    space = space_for_shapes("e64:8192x2048x2048,8192x2048x2048")
    grouped, plain = space.problems
    with caplog.at_level(logging.INFO, logger="cutlass_tune.search._prior_strategy"):
        run, state, compiled, _ = sweep(space, tmp_path, trials=8, batch=4)
    strategy = run.strategy
    assert isinstance(strategy, PriorStrategy)
    study = next(s for s in run.studies if s.problem == grouped)
    first = study.study.trials[0].user_attrs["config_hash"]
    assert first in {c.hash for c in grouped_defaults(grouped, space)}
    assert all(c.grouped for c in strategy.picks(study, 512))
    # the grouped prior learns from the grouped rows of the store alone, the plain one from the rest
    assert strategy.refit(force=True)
    observed = strategy.observed.update()
    assert strategy.grouped_prior.rows == sum(o.problem.grouped for o in observed) > 0
    assert strategy.prior.rows == sum(not o.problem.grouped for o in observed) > 0
    assert "grouped problems: prior fitted on" in caplog.text
    assert {c.grouped for c in compiled} == {True, False}


def test_the_committed_grouped_rows_feed_the_grouped_prior_only_with_their_experts_routed_rows():
    from cutlass_tune.search._prior import committed_frame, committed_observations

    frame = committed_frame()
    plain = committed_observations(frame)
    grouped = committed_observations(frame, grouped=True)
    assert plain and not any(o.problem.grouped for o in plain)
    assert grouped and all(o.problem.grouped and o.config.grouped for o in grouped)
    for o in grouped:  # the problem is the measured one: its experts' rows, not one GEMM of m rows
        assert len(o.problem.group_rows) == o.problem.groups and sum(o.problem.group_rows) == o.problem.m
    assert {o.problem.routing for o in grouped} >= {Routing.UNIFORM, Routing.ZIPF}


def test_a_sweep_fits_its_grouped_prior_on_the_committed_grouped_rows(tmp_path, caplog):
    space = space_for_shapes("e128:4096x1536x2048")
    with caplog.at_level(logging.INFO, logger="cutlass_tune.search._prior_strategy"):
        run, *_ = sweep(space, tmp_path, trials=4, batch=4)
    strategy = run.strategy
    assert isinstance(strategy, PriorStrategy)
    committed = sum(o.problem.grouped for o in strategy.committed)
    assert committed > 0 and strategy.grouped_prior.rows >= committed
    assert f"({committed} committed" in caplog.text


def test_blockwise_fp8_grouped_seeds_are_their_own_and_valid():
    """Guards a block-wise fp8 grouped sweep starting with no seed (the bf16 grouped ones have tile K 64)."""
    from cutlass_tune.search._seeds import GROUPED_BLOCKWISE_DEFAULTS

    space = space_for_shapes("e128:4096x1536x2048", dtype="e4m3:bf16", scaling="blockwise")
    problem = space.problems[0]
    defaults = grouped_defaults(problem, space)
    assert len(defaults) == len(GROUPED_BLOCKWISE_DEFAULTS)
    assert all(c.grouped and (c.tile_n, c.tile_k) == (128, 128) and space.holds(c) for c in defaults)
    assert not defaults[0].epilogue_source  # every launch has beta = 0
