"""A gzip-compressed SQLite store (`x.sqlite.gz`, as stores are committed under benchmarks/results/)
read by `best`, `dashboard` and `BestTable.load` from a read-only decompressed copy that is
removed after; a damaged one is a one-line error."""

import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cutlass_tune.report import load_best
from cutlass_tune.report._dashboard import write_dashboard
from cutlass_tune.runtime import BestTable
from cutlass_tune.store import StoreError

from ..cli_run import cli

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "results" / "sweep-nvidia-h200.sqlite"
COMMITTED = sorted((REPO / "benchmarks" / "results").rglob("*.sqlite.gz"))


def run(*args, env=None):
    if env is None:
        return cli(*args)  # in this process: the commands' output and exit codes
    return subprocess.run([sys.executable, "-m", "cutlass_tune.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, env=env)


@pytest.fixture()
def packed(tmp_path) -> Path:
    path = tmp_path / "store.sqlite.gz"
    with open(STORE, "rb") as plain, gzip.open(path, "wb") as out:
        shutil.copyfileobj(plain, out)
    return path


def test_best_reads_a_compressed_store_as_the_plain_one_and_leaves_no_copy(packed, tmp_path):
    # Regression: the 9 committed .sqlite.gz stores could not be read by best, dashboard or BestTable.load.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    got = run("best", "--storage", packed, "--format", "csv", env=env)
    assert got.returncode == 0, got.stderr
    assert got.stdout == run("best", "--storage", STORE, "--format", "csv").stdout
    assert list(scratch.iterdir()) == []  # the decompressed copy is removed


def test_a_table_loads_from_a_compressed_store_and_names_it(packed):
    table = BestTable.load(packed)
    assert table.frame.equals(BestTable.load(STORE).frame)
    assert table.source == str(packed)


def test_the_dashboard_reads_a_compressed_store_and_names_it(packed, tmp_path):
    report = write_dashboard(packed, tmp_path / "r.html")
    assert report.storage == str(packed) and report.measurements > 0


@pytest.mark.parametrize("store", COMMITTED[:2], ids=lambda p: p.name)
def test_committed_compressed_stores_read(store):
    assert len(load_best(store)) > 0


@pytest.mark.parametrize("damage", [lambda b: b[: len(b) // 2], lambda b: b"not gzip at all" + b[15:]],
                         ids=["truncated", "not-gzip"])
def test_a_damaged_compressed_store_is_a_one_line_error(packed, damage):
    packed.write_bytes(damage(packed.read_bytes()))
    with pytest.raises(StoreError, match=f"{packed} is not a readable gzip-compressed SQLite store"):
        load_best(packed)
    r = run("best", "--storage", packed)
    assert r.returncode == 2 and r.stderr.startswith(f"error: {packed} is not a readable gzip-compressed")
    assert r.stderr.count("\n") == 1


def test_a_compressed_file_that_is_no_store_names_the_file_given(tmp_path):
    path = tmp_path / "x.sqlite.gz"
    with gzip.open(path, "wb") as out:
        out.write(b"hello, not a database" * 100)
    with pytest.raises(StoreError) as caught:
        load_best(path)
    assert str(path) in str(caught.value) and "cutlass-tune-store-" not in str(caught.value)
