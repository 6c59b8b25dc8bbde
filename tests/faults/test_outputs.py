"""Outputs through symbolic links and onto devices or FIFOs: written through, never replaced."""

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cutlass_tune._files import FileWriteError, write_atomically

REPO = Path(__file__).resolve().parent.parent.parent
STORE = REPO / "results" / "llama33b-nvidia-h200.sqlite"


def _read_fifo(path: Path, got: list[bytes]) -> threading.Thread:
    def read() -> None:
        with open(path, "rb") as f:
            got.append(f.read())
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_a_symbolic_link_stays_and_its_target_is_published(tmp_path):
    # Regression: the atomic rename replaced the link itself with a regular file.
    target = tmp_path / "real.csv"
    target.write_text("old")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    write_atomically(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.csv", "real.csv"]


def test_a_fifo_is_written_through_and_stays_a_fifo(tmp_path):
    # Regression: a device or FIFO given as -o was replaced by a regular file (as root,
    # `-o /dev/stdout` would have replaced the real entry).
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = _read_fifo(fifo, got)
    write_atomically(fifo, "through")
    reader.join(10)
    assert got == [b"through"]
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_dangling_link_into_a_missing_folder_is_one_error(tmp_path):
    link = tmp_path / "out.csv"
    link.symlink_to(tmp_path / "gone" / "out.csv")
    with pytest.raises(FileWriteError, match="cannot write"):
        write_atomically(link, "x")
    assert link.is_symlink()


@pytest.mark.skipif(not STORE.exists(), reason="needs the committed H200 store")
def test_best_writes_through_a_fifo_given_as_output(tmp_path):
    fifo = tmp_path / "table.csv"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = _read_fifo(fifo, got)
    done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "best", "--storage", str(STORE),
                           "--format", "csv", "-o", str(fifo)], capture_output=True, text=True, timeout=120)
    reader.join(10)
    assert done.returncode == 0, done.stderr
    assert got and got[0].startswith(b"gpu,problem,")
    assert stat.S_ISFIFO(fifo.stat().st_mode)


@pytest.mark.skipif(not STORE.exists(), reason="needs the committed H200 store")
@pytest.mark.parametrize("output", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"])
@pytest.mark.parametrize("command", [["best", "--format", "csv"], ["dashboard"]], ids=lambda c: c[0])
def test_standard_output_given_as_output_is_written_through_a_pipe(command, output):
    # Regression: the link was resolved to /proc/<pid>/fd/pipe:[N], which names no file:
    # "cannot write /proc/<pid>/fd/pipe:[N]: No such file or directory", exit 2.
    done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", *command, "--storage", str(STORE),
                           "-o", output], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gpu,problem," if command[0] == "best" else "<!DOCTYPE html>")


@pytest.mark.skipif(not STORE.exists(), reason="needs the committed H200 store")
def test_standard_output_appended_to_a_file_keeps_what_the_file_held(tmp_path):
    # Regression: `-o /dev/stdout >> log` renamed the table over log, losing what it held (and the
    # lines printed after it went to the replaced file).
    log = tmp_path / "log.csv"
    log.write_text("earlier line\n")
    with open(log, "a") as sink:
        done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "best", "--format", "csv", "--storage",
                               str(STORE), "-o", "/dev/stdout"], stdout=sink, stderr=subprocess.PIPE, text=True,
                              timeout=120)
    assert done.returncode == 0, done.stderr
    lines = log.read_text().splitlines()
    assert lines[0] == "earlier line" and lines[1].startswith("gpu,problem,")
    assert lines[-1].endswith("rows written to /dev/stdout")
