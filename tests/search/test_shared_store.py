"""Sweeps sharing one store (several hosts on one PostgreSQL, or several processes on one file):
a config is measured by the sweep that claimed it first; the others wait for its results, and
take it over if that sweep dies.

Slow: the sweeps race as separate processes, each importing the search stage (seconds each)."""

import collections
import dataclasses
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from cutlass_tune.search import Sweep, SweepSettings
from cutlass_tune.space import check_config
from cutlass_tune.store import ResultStore, _sql

from ..racing import start_together
from .fakes import FakeBench, FakeCompiler, space_of
from .test_sweep import SPACE, kernel_rows, variant_counts

REPO = Path(__file__).resolve().parents[2]

RACER = """
import pathlib, sys, time
from cutlass_tune.search import Sweep, SweepSettings
from cutlass_tune.space import load_space
from cutlass_tune.store import ResultStore
from tests.search.fakes import FakeBench, FakeCompiler, SlowBench

space, url, me = load_space(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
store = ResultStore(url)
store.bind_gpu(FakeBench.gpu_name)
me.with_suffix(".ready").touch()
while not me.with_name("go").exists():
    time.sleep(0.001)
bench = SlowBench(delay=0.05)
state = Sweep(space, store, url, FakeCompiler(), bench, SweepSettings(trials=12, batch=3)).run()
me.with_suffix(".measured").write_text(str(len(bench.measured)))
"""


def test_sweeps_started_at_once_on_one_store_measure_nothing_twice(tmp_path, store_url):
    """All begin with the same warm-start seeds, the case that measured configs twice before
    sweeps claimed them."""
    space_path = tmp_path / "space.yaml"
    space_path.write_text(SPACE)
    url = store_url
    racers = start_together([[sys.executable, "-c", RACER, str(space_path), url, str(tmp_path / f"sweep{i}")]
                             for i in range(3)], tmp_path, cwd=REPO)
    errors = [r.communicate(timeout=300)[1] for r in racers]
    assert [r.returncode for r in racers] == [0] * len(racers), "\n".join(errors)
    counts = variant_counts(ResultStore(url))
    assert set(counts.values()) == {1}, "a measurement was taken twice"
    per_config = collections.Counter(h for (_, h, _) in counts)
    assert set(per_config.values()) == {2 * 4}  # every kernel measured whole: two problems, four variants
    measured = [int((tmp_path / f"sweep{i}.measured").read_text()) for i in range(len(racers))]
    assert sum(measured) == len(counts)  # each row measured by one racer (how they share depends on timing)


def make(space, url, bench=None, compiler=None, **settings):
    return Sweep(space, ResultStore(url), url, compiler or FakeCompiler(), bench or FakeBench(),
                 SweepSettings(**{"trials": 6, "batch": 3, **settings}))


@pytest.fixture
def space(tmp_path):
    return space_of(tmp_path, SPACE)


def claim_for(url, run_id, hashes, *, host, pid, age_s=0.0):
    """Make the store look as if the sweep `run_id` (on `host`, process `pid`, last heard of
    `age_s` ago) were measuring `hashes`."""
    store = ResultStore(url)
    store.bind_gpu(FakeBench.gpu_name)
    with store.engine.begin() as conn:
        conn.execute(_sql.runs_table.insert(), {"run_id": run_id, "host": host, "pid": pid,
                                                "heartbeat_at": time.time() - age_s})
        if hashes:
            conn.execute(_sql.claims_table.insert(), [{"config_hash": h, "run_id": run_id} for h in hashes])


def seeds(space, url, n):
    from cutlass_tune.search import seed_configs

    store = ResultStore(url)
    return [c.hash for c in seed_configs(space, store, list(space.problems), FakeBench.gpu_name)[:n]]


def told(state, cfg_hash):
    return [t for pp in state.problems for t in pp.study.trials if t.user_attrs.get("config_hash") == cfg_hash]


def test_configs_a_live_sweep_holds_are_left_to_it(space, tmp_path):
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    held = seeds(space, url, 2)
    claim_for(url, "other-host-run", held, host="gpu-host-7", pid=1)
    bench = FakeBench()
    state = make(space, url, bench).run()
    assert not {h for h, _, _ in bench.measured} & set(held)
    assert state.compiled == 4 and state.elsewhere == 2  # the two held count against --trials 6
    for h in held:
        trials = told(state, h)
        assert trials and all(t.state is optuna.trial.TrialState.FAIL for t in trials)
        assert {t.user_attrs["reason"] for t in trials} == {"measured by another sweep on the store"}


def test_what_the_other_sweep_measured_reaches_the_waiting_trials(space, tmp_path):
    """The other sweep finishes a held config while this one compiles its next batch: this one
    tells its trials the other's results and measures none of it."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    held = seeds(space, url, 1)
    claim_for(url, "other-host-run", held, host="gpu-host-7", pid=1)
    other_bench = FakeBench()

    class Compiler(FakeCompiler):
        def __call__(self, configs):
            if len(self.calls) == 1:  # the other host records the held kernel, then lets go
                store = ResultStore(url)
                kernel = FakeCompiler()([c for c in configs_by_hash.values() if c.hash in held])[0]
                for pp in sweep.state.problems:
                    for m in other_bench.measure(kernel, pp.problem, list(space.runtime_variants(kernel.config))):
                        store.add(m, gpu=FakeBench.gpu_name, run_id="other-host-run", cublas_tflops=600.0)
                store.release(held[0], "other-host-run")
            return super().__call__(configs)

    configs_by_hash = {c.hash: c for c in space.candidates}
    bench = FakeBench()
    sweep = make(space, url, bench, Compiler())
    state = sweep.run()
    assert other_bench.measured and not {h for h, _, _ in bench.measured} & set(held)
    assert state.elsewhere == 0
    values = [t.value for t in told(state, held[0]) if t.state is optuna.trial.TrialState.COMPLETE]
    best = max(r.tflops for r in kernel_rows(ResultStore(url)) if r.config_hash == held[0])
    assert values and best in values
    assert set(variant_counts(ResultStore(url)).values()) == {1}


@pytest.mark.parametrize("host, age_s", [("this", 0.0), ("gpu-host-7", _sql.STALE_AFTER_S + 1)])
def test_configs_a_dead_sweep_held_are_taken_over(space, tmp_path, host, age_s):
    """Killed on this host (its process is gone), or silent on another for too long."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    held = seeds(space, url, 3)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    claim_for(url, "dead-run", held, host=socket.gethostname() if host == "this" else host, pid=dead.pid,
              age_s=age_s)
    bench = FakeBench()
    state = make(space, url, bench).run()
    assert set(held) <= {h for h, _, _ in bench.measured}
    assert state.elsewhere == 0 and len(kernel_rows(ResultStore(url))) == 6 * 2 * 4


@pytest.mark.parametrize("owner, left_running", [("live-run", True), ("dead-run", False), (None, False)])
def test_only_a_dead_sweeps_running_trials_are_failed_as_left_over(space, tmp_path, owner, left_running):
    """An ownerless trial (made by an older version, or by a sweep killed as it asked) is left
    over when no other sweep lives (below for when one does)."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    if owner:
        claim_for(url, "live-run", [], host="gpu-host-7", pid=1)
    claim_for(url, "dead-run", [], host="gpu-host-7", pid=1, age_s=_sql.STALE_AFTER_S + 1)
    study = make(space, url).strategy.studies[0]
    trial = study.study.ask(study.params.distributions())
    if owner:
        trial.set_user_attr("run_id", owner)
    make(space, url, trials=1).run()
    state = optuna.load_study(study_name=trial.study.study_name, storage=url).trials[trial.number].state
    assert state is (optuna.trial.TrialState.RUNNING if left_running else optuna.trial.TrialState.FAIL)


def test_a_trial_being_asked_for_while_another_sweep_lives_is_not_failed(space, tmp_path):
    """Optuna makes a trial before our sweep can name itself its owner."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    claim_for(url, "live-run", [], host="gpu-host-7", pid=1)
    study = make(space, url).strategy.studies[0]
    trial = study.study.ask(study.params.distributions())
    make(space, url, trials=1).run()
    state = optuna.load_study(study_name=trial.study.study_name, storage=url).trials[trial.number].state
    assert state is optuna.trial.TrialState.RUNNING


def test_what_another_sweep_finishes_during_the_last_batch_is_taken_in_at_the_end(space, tmp_path):
    """Results the other sweep records while this one measures its last kernel reach the
    waiting trials (not failed as left to it), and its better kernel becomes the problem's best."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    held = seeds(space, url, 1)
    claim_for(url, "other-host-run", held, host="gpu-host-7", pid=1)
    kernel = FakeCompiler()([c for c in space.candidates if c.hash == held[0]])[0]

    class OtherBench(FakeBench):  # the other host's board, 1.5x as fast
        def measure(self, kernel, problem, variants, bar=None):
            for m in super().measure(kernel, problem, variants):
                yield dataclasses.replace(m, tflops=1.5 * m.tflops, median_ms=m.median_ms / 1.5)

    class Bench(FakeBench):
        def measure(self, kernel_, problem, variants, bar=None):
            for v in variants:
                if len(self.measured) == 5 * 2 * 4 - 1:  # before our last (of 5 kernels: the held one counts)
                    store = ResultStore(url)
                    for p in space.problems:
                        for m in OtherBench().measure(kernel, p, list(space.runtime_variants(kernel.config))):
                            store.add(m, gpu=FakeBench.gpu_name, run_id="other-host-run", cublas_tflops=600.0)
                    store.release(held[0], "other-host-run")
                yield from super().measure(kernel_, problem, [v])

    state = make(space, url, Bench()).run()
    assert state.elsewhere == 0 and state.compiled == 6
    assert all(t.state is optuna.trial.TrialState.COMPLETE for t in told(state, held[0]))
    for pp in state.problems:
        assert pp.best_config.hash == held[0] and pp.best_at is None
        assert pp.best_ratio == pytest.approx(max(r.ratio for r in kernel_rows(ResultStore(url))
                                                  if r.problem == pp.problem.name))


def test_configs_another_sweep_holds_count_against_the_trials(space, tmp_path):
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    held = [c.hash for c in space.candidates if not check_config(c)][-4:]  # no warm-start seeds
    claim_for(url, "other-host-run", held, host="gpu-host-7", pid=1)
    compiler = FakeCompiler()
    state = make(space, url, compiler=compiler, trials=6).run()
    compiled = [c.hash for call in compiler.calls for c in call]
    assert len(compiled) == 2 and not set(compiled) & set(held)
    assert state.stop_reason == "trial budget reached"
