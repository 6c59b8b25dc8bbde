"""Killing a sweep process (SIGKILL, SIGINT) loses at most the measurements in flight (one per GPU).

Slow: each test starts the sweep process it kills (a fresh interpreter, seconds)."""

import collections
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cutlass_tune.search import Sweep, SweepSettings
from cutlass_tune.space import load_space
from cutlass_tune.store import ResultStore

from .fakes import FakeBench, FakeCompiler
from .test_sweep import SPACE, kernel_rows

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import sys, time
from cutlass_tune.search import Sweep, SweepSettings
from cutlass_tune.space import load_space
from cutlass_tune.store import ResultStore
from tests.search.fakes import FakeCompiler, SlowBench

url, gpus = sys.argv[2], int(sys.argv[3])
try:
    Sweep(load_space(sys.argv[1]), ResultStore(url), url, FakeCompiler(), [SlowBench(delay=0.05) for _ in range(gpus)],
          SweepSettings(trials=6, batch=3)).run()
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.parametrize("gpus", [1, 2])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_sweep_resumes_without_loss_or_repeats(tmp_path, store_url, sig, gpus):
    space_path = tmp_path / "space.yaml"
    space_path.write_text(SPACE)
    url = store_url
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(space_path), url, str(gpus)], cwd=REPO,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler))
    store = ResultStore(url)  # one for all polls (on PostgreSQL each store holds connections)
    deadline = time.monotonic() + 60
    seen = 0
    while time.monotonic() < deadline and seen < 12:
        time.sleep(0.1)
        try:
            seen = len(kernel_rows(store))  # none until the child has made the tables
        except Exception:  # the child may be creating them
            seen = 0
    assert child.poll() is None, "the sweep ended before it could be interrupted"
    child.send_signal(sig)
    code = child.wait(timeout=30)
    assert code == (130 if sig == signal.SIGINT else -signal.SIGKILL)
    kept = kernel_rows(store)
    assert len(kept) >= seen >= 12  # nothing committed before the kill was lost
    assert len(kept) < 6 * 2 * 4, "the interrupted sweep had finished: nothing left to resume"

    resumed = FakeBench()
    state = Sweep(load_space(space_path), ResultStore(url), url, FakeCompiler(), resumed,
                  SweepSettings(trials=6, batch=3)).run()
    assert state.compiled == 6
    rows = kernel_rows(store)
    keys = collections.Counter((r.problem, r.config_hash, r.runtime) for r in rows)
    assert set(keys.values()) == {1}, "a measurement was taken twice"
    assert len(rows) == 6 * 2 * 4
    assert len(resumed.measured) == len(rows) - len(kept)
