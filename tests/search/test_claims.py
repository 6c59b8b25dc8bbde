"""Claims on a shared store: two sweeps' sides of it, in one process."""

import contextlib

import pytest

from cutlass_tune.search._claims import Claims
from cutlass_tune.search._ledger import Ledger
from cutlass_tune.space import check_config
from cutlass_tune.store import ResultStore

from .fakes import record, space_of
from .test_sweep import SPACE


@pytest.fixture
def space(tmp_path):
    return space_of(tmp_path, SPACE)


@pytest.fixture
def store(tmp_path):
    store = ResultStore(f"sqlite:///{tmp_path / 'store.sqlite'}")
    with contextlib.ExitStack() as running:
        for run_id in ("ours", "theirs"):
            running.enter_context(store.running(run_id))
        yield store


def test_a_config_another_sweep_holds_is_waited_for_or_left(space, store):
    cfg, other = [c for c in space.candidates if not check_config(c)][:2]
    ours, theirs = Claims(store, "ours"), Claims(store, "theirs")
    assert theirs.claim(cfg) and theirs.claim(cfg)  # claiming again is no harm
    assert ours.others() == {cfg.hash}
    assert not ours.claim(cfg, wait=False) and cfg.hash not in ours
    assert not ours.claim(cfg) and cfg.hash in ours and len(ours) == 1
    assert ours.claim(other) and other.hash not in ours and theirs.others() == {other.hash}


def test_settling_tells_what_the_other_finished_and_takes_over_what_it_gave_up(space, store):
    finished, given_up, held = [c for c in space.candidates if not check_config(c)][:3]
    ours, theirs = Claims(store, "ours"), Claims(store, "theirs")
    for cfg in (finished, given_up, held):
        assert theirs.claim(cfg) and not ours.claim(cfg)
    record(store, space, finished, run_id="theirs")
    theirs.release(finished)
    theirs.release(given_up)  # unmeasured: it stopped
    ledger = Ledger(store, space, space.problems)
    ledger.absorb()
    assert ours.settle(ledger) == ([finished], [given_up])
    assert set(ours.elsewhere) == {held.hash} and theirs.others() == {given_up.hash}
