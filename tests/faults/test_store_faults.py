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
    done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", *args, "--storage", str(store)],
                          capture_output=True, text=True, timeout=120)
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
    done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "upgrade", "--storage", str(store)],
                          capture_output=True, text=True, timeout=120)
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
