"""The strategy alone: proposals asked of the studies and answered from recorded measurements."""

import optuna
import pytest

import cutlass_tune.search._optuna_strategy as strategy_module
import cutlass_tune.search._studies as studies_module
from cutlass_tune.measurement import TimingMethod, TimingScheme
from cutlass_tune.search import (
    STRATEGIES,
    OptunaStrategy,
    PriorStrategy,
    StrategyContext,
    Studies,
    make_strategy,
    params_of,
    register_strategy,
)
from cutlass_tune.search._claims import Claims
from cutlass_tune.search._ledger import Ledger
from cutlass_tune.space import check_config
from cutlass_tune.store import ResultStore

from .fakes import record, space_of
from .test_sweep import SPACE, _Stuck


@pytest.fixture
def space(tmp_path):
    return space_of(tmp_path, SPACE)


@pytest.fixture
def parts(space, tmp_path):
    """A strategy with its ledger and claims, on one store, its sweep running."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    store = ResultStore(url)
    with store.running("ours"):
        strategy = optuna_strategy(space, url, store, "random")
        yield strategy, Ledger(store, space, space.problems), Claims(store, "ours"), store


def optuna_strategy(space, url, store, sampler):
    studies = Studies(space, url, sampler=sampler, seed=0, arch="sm90a", gpu="Fake GPU", run_id="ours")
    return OptunaStrategy(StrategyContext(space, studies, store, "Fake GPU", 132, TimingScheme(TimingMethod.EVENTS), 0))


def trials_of(strategy, cfg_hash):
    """(study, trial) for each trial of the config."""
    return [(s, t) for s in strategy.studies for t in s.study.trials if t.user_attrs.get("config_hash") == cfg_hash]


def test_a_stalled_samplers_known_proposals_are_answered_and_unproposed_configs_fill_the_batch(
        space, tmp_path, monkeypatch):
    known, *rest = [c for c in space.candidates if not check_config(c)]
    monkeypatch.setattr(studies_module, "make_sampler", lambda name, **kw: _Stuck(params_of(known)))
    monkeypatch.setattr(strategy_module, "ASKS_PER_CONFIG", 2)
    url = f"sqlite:///{tmp_path / 'stalled.sqlite'}"
    store = ResultStore(url)
    record(store, space, known)
    ledger = Ledger(store, space, space.problems)
    ledger.absorb()
    with store.running("ours"):
        strategy = optuna_strategy(space, url, store, "tpe")
        assert strategy.ask(3, ledger, Claims(store, "ours")) == rest[:3]  # in the file's order
    told = trials_of(strategy, known.hash)
    assert len(told) == 2 * (3 + 2)  # every ask answered, none compiled
    for s, t in told:
        assert t.state is optuna.trial.TrialState.COMPLETE and t.value == ledger.value(s.problem, known.hash)


def test_invalid_proposals_are_told_as_infeasible(parts):
    # Guards against invalid configs stored as complete trials of 0 TFLOP/s, which optuna-dashboard
    # plots and parameter importances rank by.
    strategy, ledger, claims, _ = parts
    batch = strategy.ask(6, ledger, claims)
    assert len(batch) == len({c.hash for c in batch}) == 6 and not any(check_config(c) for c in batch)
    infeasible = [t for s in strategy.studies for t in s.study.trials if t.constraints.get("invalid") == 1.0]
    assert strategy.studies.invalid == len(infeasible) > 0
    assert all(t.state is optuna.trial.TrialState.PRUNED and t.value is None and t.user_attrs["reason"]
               for t in infeasible)
    for s in strategy.studies:
        assert s.study.metric_names == ["TFLOP/s"]
        assert not [t for t in s.study.trials if t.state is optuna.trial.TrialState.COMPLETE and t.value == 0.0]


def test_a_result_reaches_the_asking_trial_and_every_study_of_its_kind(parts, space):
    strategy, ledger, claims, store = parts
    (cfg,) = strategy.ask(1, ledger, claims)
    record(store, space, cfg)
    ledger.absorb()
    strategy.tell(cfg, ledger)
    told = trials_of(strategy, cfg.hash)
    assert [s.name for s, _ in told] == [s.name for s in strategy.studies]  # asked in one, added to the other
    assert all(t.state is optuna.trial.TrialState.COMPLETE for _, t in told)
    assert all(t.value == ledger.value(s.problem, cfg.hash) > 0 for s, t in told)


def test_trials_waiting_on_another_sweep_are_failed_with_the_reason_when_it_stops(space, tmp_path, monkeypatch):
    held, *rest = [c for c in space.candidates if not check_config(c)]
    monkeypatch.setattr(studies_module, "make_sampler", lambda name, **kw: _Stuck(params_of(held)))
    monkeypatch.setattr(strategy_module, "ASKS_PER_CONFIG", 1)
    url = f"sqlite:///{tmp_path / 'held.sqlite'}"
    store = ResultStore(url)
    with store.running("ours"), store.running("theirs"):
        assert Claims(store, "theirs").claim(held)
        strategy = optuna_strategy(space, url, store, "tpe")
        claims = Claims(store, "ours")
        assert strategy.ask(1, Ledger(store, space, space.problems), claims) == rest[:1]
        assert set(claims.elsewhere) == {held.hash}
        strategy.studies.abandon(claims.elsewhere)
    waited = trials_of(strategy, held.hash)
    assert len(waited) == 3  # each ask waited on the other sweep
    assert all(t.state is optuna.trial.TrialState.FAIL for _, t in waited)
    assert {t.user_attrs["reason"] for _, t in waited} == {"measured by another sweep on the store"}


def test_strategies_are_made_by_name_from_the_registry(space, tmp_path):
    url = f"sqlite:///{tmp_path / 'named.sqlite'}"
    store = ResultStore(url)
    studies = Studies(space, url, sampler="random", seed=0, arch="sm90a", gpu="Fake GPU", run_id="ours")
    context = StrategyContext(space, studies, store, "Fake GPU", 132, TimingScheme(TimingMethod.EVENTS), 0)
    assert set(STRATEGIES) >= {"optuna", "prior"}
    assert isinstance(make_strategy(None, context), OptunaStrategy)  # a space of lists
    assert isinstance(make_strategy("prior", context), PriorStrategy)
    with pytest.raises(ValueError, match="unknown strategy 'annealing': use one of optuna, prior"):
        make_strategy("annealing", context)
    with pytest.raises(ValueError, match="'optuna' is registered already"):
        register_strategy("optuna", OptunaStrategy)


def test_a_registered_strategy_of_ones_own_leads_a_sweep(tmp_path, monkeypatch):
    """Guards the seam: the sweep asks and tells whatever the registry builds, through its studies."""
    from cutlass_tune.search import Sweep, SweepSettings

    from .fakes import FakeBench, FakeCompiler

    class InFileOrder:
        def __init__(self, context):
            self.context, self.told = context, []

        def warm_start(self):
            pass

        def ask(self, want, ledger, claims):
            return self.context.studies.unproposed(want, ledger, claims)

        def tell(self, cfg, ledger):
            self.told.append(cfg.hash)
            self.context.studies.tell(cfg, ledger)

    monkeypatch.setitem(STRATEGIES, "in_file_order", InFileOrder)
    space = space_of(tmp_path, SPACE)
    url = f"sqlite:///{tmp_path / 'own.sqlite'}"
    compiler = FakeCompiler()
    run = Sweep(space, ResultStore(url), url, compiler, FakeBench(),
                SweepSettings(trials=3, batch=3, strategy="in_file_order"))
    run.run()
    compiled = [c for call in compiler.calls for c in call]
    assert compiled == [c for c in space.candidates if not check_config(c)][:3]
    assert sorted(run.strategy.told) == sorted(c.hash for c in compiled)
