"""Damaged stores: every reading command and API entry point gives one StoreError line, exit 2."""

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import cutlass_tune
from cutlass_tune.measurement import TimingScheme
from cutlass_tune.store import ResultStore, StoreError

from ..cli_run import cli

REAL = Path(__file__).resolve().parents[2] / "results" / "quick-nvidia-h200.sqlite"


def _not_a_database(tmp: Path) -> Path:
    (tmp / "s.sqlite").write_text("x\n")
    return tmp / "s.sqlite"


def _truncated(tmp: Path) -> Path:
    (tmp / "t.sqlite").write_bytes(REAL.read_bytes()[:100_000])
    return tmp / "t.sqlite"


def _edited(tmp: Path, sql: str) -> Path:
    path = tmp / "e.sqlite"
    shutil.copy(REAL, path)
    with sqlite3.connect(path) as conn:
        conn.execute(sql)
    return path


def _bad_figure(tmp: Path) -> Path:
    return _edited(tmp, "update ct_measurements set tflops='abc' where id=2")


def _bad_status(tmp: Path) -> Path:
    return _edited(tmp, "update ct_measurements set status='bogus' where id=2")


DAMAGES = [pytest.param(_not_a_database, id="not-a-database"), pytest.param(_truncated, id="truncated"),
           pytest.param(_bad_figure, id="non-numeric-figure"), pytest.param(_bad_status, id="unknown-status")]
COMMANDS = [["best"], ["dashboard", "-o", "{tmp}/d.html"], ["export", "-o", "{tmp}/b"], ["confirm"]]


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_every_reading_command_gives_one_line_and_exit_2(damage, command, tmp_path):
    # Regression: a damaged store (or row) was a ~190-line SQLAlchemy/ValueError traceback, exit 1.
    store = damage(tmp_path)
    before = store.read_bytes()
    args = [a.format(tmp=tmp_path) for a in command]
    done = cli(*args, "--storage", store, cwd=Path.cwd())  # in this process: its output and exit code
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    if not (command == ["confirm"] and damage in (_bad_figure, _bad_status)):  # a CPU host stops at the GPU
        assert str(store.name) in done.stderr
    assert not (tmp_path / "d.html").exists() and not (tmp_path / "b").exists()
    assert store.read_bytes() == before


@pytest.mark.parametrize("damage", DAMAGES)
def test_load_best_raises_store_error(damage, tmp_path):
    # Regression: load_best let sqlite3.DatabaseError / ValueError out of a damaged store.
    store = damage(tmp_path)
    with pytest.raises(StoreError) as info:
        cutlass_tune.load_best(store)
    assert "\n" not in str(info.value) and store.name in str(info.value)


@pytest.mark.parametrize("damage", DAMAGES)
def test_matmul_with_a_damaged_store_raises_store_error(damage, tmp_path):
    # Regression: matmul(table=store) let the database's own error out.
    torch = pytest.importorskip("torch")
    store = damage(tmp_path)
    a = torch.zeros(64, 64, dtype=torch.bfloat16)
    with pytest.raises(StoreError):
        cutlass_tune.matmul(a, a.t(), table=str(store))


@pytest.mark.parametrize("damage", DAMAGES[:2])
def test_the_store_names_the_damage(damage, tmp_path):
    # Regression: the store's methods raised SQLAlchemy's DatabaseError, not StoreError.
    store = ResultStore(f"sqlite:///{damage(tmp_path)}")
    with pytest.raises(StoreError, match="is damaged"):
        store.rows()
    with pytest.raises(StoreError, match="is damaged"):
        store.check_schema()


def test_announcing_a_sweep_on_a_damaged_store_raises_store_error(tmp_path):
    # Regression: `running` let SQLAlchemy's DatabaseError out of a store damaged after opening.
    path = tmp_path / "s.sqlite"
    store = ResultStore(f"sqlite:///{path}")
    store.bind_gpu("NVIDIA H200")
    path.write_bytes(b"x" * 4096)
    with pytest.raises(StoreError, match="is damaged"):
        with store.running("run-1"):
            pass


@pytest.mark.parametrize("damage", DAMAGES[:2])
def test_upgrading_a_damaged_store_is_one_line_and_writes_nothing(damage, tmp_path):
    store = damage(tmp_path)
    before = store.read_bytes()
    done = cli("upgrade", "--storage", store, cwd=Path.cwd())
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "is damaged" in done.stderr, done.stderr
    assert store.read_bytes() == before


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_sweep_on_a_damaged_store_raises_store_error(damage, tmp_path):
    # The sweep's path past the GPU check, which the CLI tests above cannot reach on a CPU host.
    from cutlass_tune.search import Sweep, SweepSettings

    from ..search.fakes import FakeBench, FakeCompiler, space_of

    class H200(FakeBench):
        gpu_name, scheme = "NVIDIA H200", TimingScheme.parse("events-paired")  # the store's, as its ct_meta says

    store = damage(tmp_path)
    url = f"sqlite:///{store}"
    space = space_of(tmp_path, "problems: {m: 4096, n: 4096, k: 4096}\nkernels: {tile_m: [128]}\n")
    with pytest.raises(StoreError, match="is damaged"):
        Sweep(space, ResultStore(url), url, FakeCompiler(), H200(), SweepSettings(trials=1)).run()


# ---- issue 36: file names, foreign files, locked writers, the default store ------------------------------------------
ODD_NAMES = ["a?b.sqlite", "run?1.sqlite", "a%20b.sqlite", "x#y.sqlite"]


def _measurement(tflops: float = 500.0):
    from cutlass_tune.measurement import Measurement
    from cutlass_tune.space import KernelConfig, Problem, RuntimeArgs
    from cutlass_tune.status import Status

    p = Problem(4096, 4096, 4096)
    return Measurement(problem=p, config=KernelConfig(), runtime=RuntimeArgs(), status=Status.OK, tflops=tflops,
                       median_ms=p.flops / tflops / 1e9, p20_ms=0.1, p80_ms=0.2, samples=10)


@pytest.mark.parametrize("name", ODD_NAMES)
def test_a_store_path_is_the_file_it_names_for_writer_and_reader(name, tmp_path, monkeypatch):
    # Regression: `?`, `#`, `%` went into the URL unescaped: `run?1.sqlite` made `run`, `a%20b` read `a b`.
    from cutlass_tune.store import open_store

    monkeypatch.chdir(tmp_path)
    if "%20" in name:
        (tmp_path / name.replace("%20", " ")).write_bytes(b"")  # a decoy the reader must not read
    writer = open_store(name, new=True)
    writer.bind_gpu("NVIDIA H200")
    writer.add(_measurement(), gpu="NVIDIA H200", run_id="r")
    made = sorted(p.name for p in tmp_path.iterdir())
    assert name in made and len(made) == (2 if "%20" in name else 1), made
    assert len(open_store(name).rows()) == 1
    assert len(open_store(str(tmp_path / name)).rows()) == 1
    done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "best", "--storage", name],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**__import__("os").environ, "PYTHONPATH": str(Path(cutlass_tune.__file__).parents[1])})
    assert "no store" not in done.stderr and "4096x4096x4096" in done.stdout, done.stderr


@pytest.mark.parametrize("name", ODD_NAMES)
def test_a_reader_of_a_missing_odd_name_says_no_store_and_makes_nothing(name, tmp_path, monkeypatch):
    from cutlass_tune.store import open_store

    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match="no store at"):
        open_store(name)
    assert list(tmp_path.iterdir()) == []


def _foreign(tmp: Path) -> Path:
    path = tmp / "app.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("create table users (id integer primary key, name text)")
        conn.execute("insert into users (name) values ('ada')")
    conn.close()
    return path


def test_a_writer_refuses_another_applications_sqlite_file_and_leaves_it_as_it_was(tmp_path):
    # Regression: a sweep's writer added its ct_ and Optuna tables to any SQLite file without a word.
    from cutlass_tune.store import open_store

    path = _foreign(tmp_path)
    before = path.read_bytes()
    store = open_store(str(path), new=True)
    with pytest.raises(StoreError, match=f"^{path} is not a cutlass-tune store: .*give --storage a new file$"):
        store.bind_gpu("NVIDIA H200")
    with pytest.raises(StoreError, match="is not a cutlass-tune store"):
        store.add(_measurement(), gpu="NVIDIA H200", run_id="r")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.sqlite"]


def test_a_writer_still_takes_an_empty_sqlite_file(tmp_path):
    path = tmp_path / "empty.sqlite"
    path.touch()
    store = ResultStore(f"sqlite:///{path}")
    store.bind_gpu("NVIDIA H200")
    assert store.gpu() == "NVIDIA H200"


ADDER = """
import sys, time
from pathlib import Path
from cutlass_tune.store import ResultStore, _sql
from tests.faults.test_store_faults import _measurement
url, me, n, timeout = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
_sql.BUSY_TIMEOUT_S = timeout
store = ResultStore(url)
store.bind_gpu("NVIDIA H200")
me.with_suffix(".ready").touch()
while not me.with_name("go").exists():
    time.sleep(0.001)
for i in range(n):
    store.add(_measurement(100.0 + i), gpu="NVIDIA H200", run_id=me.name)
"""


@pytest.mark.parametrize("busy_timeout_s", [60.0, 0.01], ids=["default", "tiny-busy-timeout"])
def test_writers_adding_at_once_lose_no_row(busy_timeout_s, tmp_path):
    # Regression: 3 of 1,200 adds of concurrent writers were lost to SQLite's 5 s busy timeout on a loaded host;
    # a busy timeout of 10 ms makes every writer meet the lock, which a locked write's retries must get past.
    from ..racing import start_together

    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    ResultStore(url).bind_gpu("NVIDIA H200")
    root = str(Path(__file__).resolve().parents[2])
    racers = start_together([[sys.executable, "-c", ADDER, url, str(tmp_path / f"w{i}"), "50", str(busy_timeout_s)]
                             for i in range(4)], tmp_path, cwd=Path(root))
    errors = [r.communicate(timeout=120)[1] for r in racers]
    assert [r.returncode for r in racers] == [0] * 4, "\n".join(errors)
    rows = ResultStore(url).rows(["run_id"])
    assert sorted(r.run_id for r in rows) == sorted(f"w{i}" for i in range(4) for _ in range(50))


def test_a_write_waits_out_a_lock_held_past_the_busy_timeout(tmp_path, monkeypatch):
    # Regression: an add that met a lock held longer than the busy timeout was lost, not retried.
    import threading

    from cutlass_tune.store import _sql

    path = tmp_path / "s.sqlite"
    ResultStore(f"sqlite:///{path}").bind_gpu("NVIDIA H200")
    monkeypatch.setattr(_sql, "BUSY_TIMEOUT_S", 0.05)
    store = ResultStore(f"sqlite:///{path}")
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    threading.Timer(0.3, holder.execute, ["COMMIT"]).start()
    store.add(_measurement(), gpu="NVIDIA H200", run_id="r")
    holder.close()
    assert len(store.rows()) == 1


def test_upgrade_without_storage_refuses_and_leaves_the_default_store(tmp_path):
    # Regression: `upgrade` with no --storage upgraded the checkout's committed default store in place.
    for args in (["upgrade"], ["upgrade", "--storage", ""]):
        done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", *args],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path,
                              env={**__import__("os").environ, "CUTLASS_TUNE_STORE": str(REAL),
                                   "PYTHONPATH": str(Path(cutlass_tune.__file__).parents[1])})
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--storage" in done.stderr, done.stderr


def test_dashboard_of_a_store_whose_study_table_is_damaged_is_one_line(tmp_path):
    """Guards the dashboard's Optuna reads (outside the store's error wrapper: a 468-line traceback, exit 1)."""
    store = _edited(tmp_path, "alter table studies rename column study_name to name")
    done = cli("dashboard", "--storage", store, "-o", tmp_path / "d.html", cwd=Path.cwd())
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert "study_name" in done.stderr and not (tmp_path / "d.html").exists()


def test_dashboard_losing_the_server_after_the_rows_are_read_raises_store_error(tmp_path, monkeypatch):
    """Guards the dashboard against a server lost between reading the rows and Optuna's studies
    (SQLAlchemy's OperationalError escaped as a traceback)."""
    import optuna
    import sqlalchemy as sa

    from cutlass_tune.report import build_dashboard

    def lost(storage):
        raise sa.exc.OperationalError("SELECT studies.study_name FROM studies", {},
                                      Exception("server closed the connection unexpectedly"))

    monkeypatch.setattr(optuna.study, "get_all_study_names", lost)
    store = tmp_path / "s.sqlite"
    shutil.copy(REAL, store)
    with pytest.raises(StoreError, match="^cannot use the store .*: server closed the connection unexpectedly$"):
        build_dashboard(store)


LOCKED_WRITER = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal: a CI job in the background ignores it
from cutlass_tune.store import ResultStore
from tests.faults.test_store_faults import _measurement
store = ResultStore(sys.argv[1])
print("ready", flush=True)
store.add(_measurement(), gpu="NVIDIA H200", run_id="r")
"""
LOCKED_READER = """
import sys
import cutlass_tune.cli, cutlass_tune.report, cutlass_tune.store
print("ready", flush=True)
sys.argv = ["cutlass-tune", "best", "--storage", sys.argv[1]]
cutlass_tune.cli.main()
"""


def _interrupted_while_locked(script: str, store: Path, lock: str) -> tuple[subprocess.CompletedProcess, float]:
    import signal
    import time

    holder = sqlite3.connect(store, isolation_level=None)
    holder.execute(lock)
    try:
        proc = subprocess.Popen([sys.executable, "-c", script, f"sqlite:///{store}"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        time.sleep(1.5)  # the process now waits for the lock
        assert proc.poll() is None
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), time.monotonic() - start
    finally:
        holder.close()


def test_ctrl_c_stops_an_api_writer_waiting_for_a_lock_with_keyboard_interrupt(tmp_path):
    """Guards a writer waiting on a SQLite lock: Ctrl-C took effect after the 60 s busy timeout, as
    "database is locked"."""
    store = tmp_path / "s.sqlite"
    ResultStore(f"sqlite:///{store}").bind_gpu("NVIDIA H200")
    done, waited = _interrupted_while_locked(LOCKED_WRITER, store, "BEGIN IMMEDIATE")
    assert waited < 10, waited
    assert done.stderr.strip().splitlines()[-1] == "KeyboardInterrupt", done.stderr[-2000:]
    assert ResultStore(f"sqlite:///{store}").rows() == []


def test_ctrl_c_stops_a_command_waiting_for_a_lock_and_says_interrupted(tmp_path):
    """Guards `best` on a store another process holds locked: Ctrl-C took effect after the 60 s busy timeout."""
    store = tmp_path / "s.sqlite"
    shutil.copy(REAL, store)
    done, waited = _interrupted_while_locked(LOCKED_READER, store, "BEGIN EXCLUSIVE")
    assert waited < 10, waited
    assert done.returncode == 130 and done.stderr == "interrupted\n", done.stderr[-2000:]


def test_a_new_store_on_a_full_disk_leaves_no_empty_file(tmp_path):
    """Guards against a new store whose tables a full disk refused leaving a 0-byte file behind."""
    import sqlalchemy as sa

    path = tmp_path / "new.sqlite"
    store = ResultStore(f"sqlite:///{path}")
    # SQLite's page limit fails a write as a full disk does: "database or disk is full"
    sa.event.listen(store.engine, "connect", lambda conn, _: conn.execute("PRAGMA max_page_count = 1"))
    with pytest.raises(StoreError, match="database or disk is full"):
        store.bind_gpu("NVIDIA H200")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
