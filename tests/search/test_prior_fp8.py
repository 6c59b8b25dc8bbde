"""The seeds and prior of fp8 problems: hand-picked fp8 configs lead (swapped kernels at small M),
never the 16-bit prior's 256-row tiles of K 64."""

import logging

from cutlass_tune.search._features import FEATURES, config_columns, features
from cutlass_tune.search._prior_strategy import FP8_OWN_PRIOR_PROBLEMS, PriorStrategy
from cutlass_tune.search._seeds import FP8_DEFAULTS, FP8_SMALL_M_DEFAULTS, fp8_defaults, seed_configs, wave_fill
from cutlass_tune.space import DType, KernelConfig, KernelSchedule, Problem, Scaling, space_for_shapes
from cutlass_tune.store import ResultStore

from .test_prior import no_committed, sweep  # noqa: F401  (a fixture and a helper)


def test_small_m_rowcol_problems_are_led_by_the_swapped_kernels(tmp_path):
    space = space_for_shapes("16x4096x4096,4096x4096x4096", dtype="e4m3", scaling="rowcol")
    small, large = space.problems
    first = fp8_defaults(small, space)
    assert len(first) == len(FP8_SMALL_M_DEFAULTS) + len(FP8_DEFAULTS)
    assert [(c.tile_m, c.tile_n, c.tile_k, c.swap_ab) for c in first[:2]] == [(64, 16, 256, True), (64, 64, 256, True)]
    big = fp8_defaults(large, space)
    assert not any(c.swap_ab for c in big)
    assert (big[0].tile_m, big[0].tile_n, big[0].tile_k, big[0].cluster_m, big[0].kernel_schedule,
            big[0].fp8_fast_accum) == (128, 128, 128, 2, KernelSchedule.PINGPONG, True)
    assert all(c.tile_k >= 128 and space.holds(c) for c in first + big)
    store = ResultStore(f"sqlite:///{tmp_path / 's.sqlite'}")
    assert seed_configs(space, store, [small])[:len(first)] == first


def test_swapped_kernels_are_seeded_for_rowcol_problems_only():
    plain = space_for_shapes("16x4096x4096", dtype="e4m3")
    assert not any(c.swap_ab for c in fp8_defaults(plain.problems[0], plain))
    assert fp8_defaults(space_for_shapes("16x4096x4096").problems[0], plain) == []


def test_a_swapped_configs_tiles_run_over_the_transposed_problem():
    problem = Problem(16, 4096, 4096, dtype_a=DType.E4M3, dtype_b=DType.E4M3, scaling=Scaling.ROWCOL)
    cfg = KernelConfig.for_operation(problem, tile_m=64, tile_n=16, tile_k=256, fp8_fast_accum=True, swap_ab=True)
    row = features(problem, config_columns([cfg]), 132)[0]
    assert row[FEATURES.index("tiles_m")] == 4096 / 64 and row[FEATURES.index("tiles_n")] == 1
    assert row[FEATURES.index("pad_n")] == 1.0  # 16 rows fill the 16-wide tile N
    unswapped = KernelConfig.for_operation(problem, tile_m=64, tile_n=16, tile_k=256, fp8_fast_accum=True)
    assert features(problem, config_columns([unswapped]), 132)[0][FEATURES.index("pad_m")] == 0.25
    assert wave_fill(cfg, problem, 132) > wave_fill(unswapped, problem, 132)


def test_an_fp8_problem_is_led_by_the_fp8_defaults_and_its_prior_learns_fp8_once_it_has_results(
        tmp_path, caplog, no_committed):  # noqa: F811
    """Slow: walks the fp8 row-wise kind (618,368 valid configs, seconds) that its sweep's prior ranks."""
    space = space_for_shapes("32x4096x4096,4096x4096x4096", dtype="e4m3", scaling="rowcol")
    with caplog.at_level(logging.INFO, logger="cutlass_tune.search._prior_strategy"):
        run, _, compiled, _ = sweep(space, tmp_path, trials=6, batch=2)
    assert isinstance(run.strategy, PriorStrategy)
    by_hash = {c.hash: c for c in compiled}
    for study in run.studies:
        defaults = {c.hash for c in fp8_defaults(study.problem, space)}
        first = [by_hash[t.user_attrs["config_hash"]] for t in study.study.trials[:2]]
        assert all(c.hash in defaults for c in first)
        # regression: the 16-bit prior's 256-row tiles of K 64 led fp8 problems
        assert all(c.tile_k >= 128 for c in first)
    assert "fp8 problems: prior fitted on" in caplog.text
    assert len(space.problems) < FP8_OWN_PRIOR_PROBLEMS and "16-bit and fp8" in caplog.text
