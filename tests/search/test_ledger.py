"""The ledger: what the store says is done, read from recorded measurements."""

import pytest

from cutlass_tune.search._ledger import Ledger
from cutlass_tune.space import check_config, load_space
from cutlass_tune.store import ResultStore

from .fakes import FakeBench, FakeCompiler, record, synthetic_tflops
from .test_sweep import SPACE


def space_of(tmp_path, text=SPACE):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return load_space(path)


@pytest.fixture
def space(tmp_path):
    return space_of(tmp_path)


@pytest.fixture
def store(tmp_path):
    return ResultStore(f"sqlite:///{tmp_path / 'store.sqlite'}")


def valid(space, n):
    return [c for c in space.candidates if not check_config(c)][:n]


def test_a_part_measured_config_is_unfinished_until_every_problem_has_every_variant(space, store):
    (cfg,) = valid(space, 1)
    small, large = space.problems
    variants = list(space.runtime_variants(cfg))
    record(store, space, cfg, problems=[small], variants=variants[:2])
    ledger = Ledger(store, space, space.problems)
    ledger.absorb()
    assert ledger.compiled == {cfg.hash}
    assert ledger.missing(cfg, small) == variants[2:] and ledger.missing(cfg, large) == variants
    assert not ledger.complete(cfg) and ledger.unfinished() == [cfg]
    assert ledger.value(small, cfg.hash) == max(synthetic_tflops(cfg, small, v) for v in variants[:2])
    assert ledger.value(large, cfg.hash) is None and not ledger.tried(large, cfg.hash)

    record(store, space, cfg, problems=[small], variants=variants[2:])
    record(store, space, cfg, problems=[large])
    ledger.absorb()  # only the rows added since
    assert ledger.complete(cfg) and ledger.unfinished() == []
    assert ledger.value(large, cfg.hash) == max(synthetic_tflops(cfg, large, v) for v in variants)


def test_a_measurement_noted_counts_before_the_store_is_read_again(space, store):
    (cfg,) = valid(space, 1)
    problem = space.problems[0]
    kernel = FakeCompiler()([cfg])[0]
    ledger = Ledger(store, space, space.problems)
    ledger.add_compiled([cfg.hash])
    for m in FakeBench().measure(kernel, problem, space.runtime_variants(cfg)):
        ledger.note(m)
    assert ledger.compiled == {cfg.hash} and ledger.missing(cfg, problem) == []
    assert ledger.value(problem, cfg.hash) > 0
    ledger.fail(problem, cfg.hash)  # it compiles no more
    assert ledger.value(problem, cfg.hash) is None


def test_a_failed_config_has_no_value_and_its_reason(space, store):
    (cfg,) = valid(space, 1)
    record(store, space, cfg, bench=FakeBench(wrong_tile_m=cfg.tile_m))
    ledger = Ledger(store, space, space.problems)
    ledger.absorb()
    assert ledger.complete(cfg)
    for p in space.problems:
        assert ledger.value(p, cfg.hash) is None
        assert ledger.failure_reason(p, cfg) == "wrong_result: rel error 0.9 > 0.01"


def test_another_layouts_twin_of_a_measured_config_is_not_unfinished(tmp_path, store):
    # Regression: the twin (same knobs, other layout, other hash) was taken for unfinished,
    # and a resumed sweep over several layouts compiled it unasked.
    space = space_of(tmp_path, SPACE.replace("problems:", "layouts: [tn, nt]\nproblems:"))
    (cfg,) = valid(space, 1)
    record(store, space, cfg)
    ledger = Ledger(store, space, space.problems)
    ledger.absorb()
    assert ledger.complete(cfg) and ledger.unfinished() == []
