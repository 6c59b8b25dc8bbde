"""A store an earlier version's sweep wrote (its Optuna studies, schema 1): a sweep resumes it as
it is, after upgrading its tables."""

import shutil
import sqlite3
from pathlib import Path

import optuna

from cutlass_tune.measurement import TimingScheme
from cutlass_tune.search import Sweep, SweepSettings
from cutlass_tune.space import load_space
from cutlass_tune.store import SCHEMA_VERSION, ResultStore

from ..search.fakes import FakeBench, FakeCompiler

REPO = Path(__file__).resolve().parents[2]
QUICK = REPO / "results" / "quick-nvidia-h200.sqlite"
"""Swept before invalid trials were pruned (schema 1); its 75 invalid proposals, complete trials of 0
TFLOP/s as written, were since converted to pruned ones (`store.convert_trials`)."""


def _as_written(path: Path) -> None:
    """Undo `convert_trials` on a copy of QUICK: its invalid proposals complete at 0 TFLOP/s again
    and its study's metric unnamed, as the sweep of an earlier version left them."""
    with sqlite3.connect(path) as db:
        pruned = [row[0] for row in db.execute("SELECT trial_id FROM trials WHERE state = 'PRUNED'")]
        for trial_id in pruned:
            db.execute("UPDATE trials SET state = 'COMPLETE' WHERE trial_id = ?", (trial_id,))
            db.execute("INSERT INTO trial_values (trial_id, objective, value, value_type) VALUES (?, 0, 0.0, 'FINITE')",
                       (trial_id,))
        db.execute("DELETE FROM study_system_attributes WHERE key = 'study:metric_names'")


class H200(FakeBench):
    gpu_name, scheme = "NVIDIA H200", TimingScheme.parse("events-paired")  # the store's


def _trials(url):
    study, = optuna.study.get_all_study_summaries(url)
    loaded = optuna.load_study(study_name=study.study_name, storage=url)
    return loaded, [(t.number, t.state, t.values, t.params, t.user_attrs) for t in loaded.trials]


def test_a_sweep_resumes_studies_written_before_as_they_are(tmp_path):
    # Guards against a resumed sweep refusing, or rewriting, what an earlier version's sweep wrote.
    path = tmp_path / "quick.sqlite"
    shutil.copy(QUICK, path)
    _as_written(path)
    url = f"sqlite:///{path}"
    rows = ResultStore(url).rows()
    _, trials = _trials(url)
    assert ResultStore(url).schema() == 1 and sum(t[2] == [0.0] for t in trials) == 75
    state = Sweep(load_space(REPO / "configs" / "quick.yaml"), ResultStore(url), url, FakeCompiler(), H200(),
                  SweepSettings(trials=1)).run()
    assert state.stop_reason == "trial budget reached"
    store = ResultStore(url)
    assert store.schema() == SCHEMA_VERSION and store.rows()[:len(rows)] == rows
    study, after = _trials(url)
    assert after[:len(trials)] == trials  # the old trials as they were, invalid ones complete at 0
    assert study.metric_names == ["TFLOP/s"]  # named now, for optuna-dashboard
