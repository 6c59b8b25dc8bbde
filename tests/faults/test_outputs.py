"""Outputs through symbolic links and onto devices or FIFOs: written through, never replaced; text
read from files (a store, a table, a space file, a compiler's message) printed literally, never as
rich markup or terminal control sequences."""

import io
import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cutlass_tune._files import FileWriteError, write_atomically
from cutlass_tune.cli._console import PlainConsole, visible
from cutlass_tune.cli._sweep_display import SweepLog, sweep_table
from cutlass_tune.tables import read_table

from ..cli_run import cli

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


# Rich markup that crashed (a closing tag with no opening one), vanished (an unknown tag, as nvcc
# prints template arguments) or made a link, and ANSI colour and OSC 8 link sequences.
HOSTILE = ["[/bold]", "[with T=int]", "[link=http://x]text[/link]", "\x1b[31mred\x1b]8;;http://x\x07"]
SHOWN = [visible(h) for h in HOSTILE]  # ESC and BEL as the characters \x1b and \x07
FAKE_NVCC = REPO / "tests" / "compile" / "fake_nvcc.py"


def _cli(*args, **kw) -> subprocess.CompletedProcess:
    if not kw:
        return cli(*args)  # in this process: the command's output and exit code
    return subprocess.run([sys.executable, "-m", "cutlass_tune.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=120, cwd=REPO, **kw)


def _shown_literally(text: str, hostile: list[str] = SHOWN) -> None:
    assert "\x1b" not in text and "\x07" not in text and "Traceback" not in text, text
    for h in hostile:
        assert h in text, (h, text)


def test_visible_escapes_every_control_character_but_newline_and_tab():
    assert visible("a\x1b[31mb\x07\x9b1m\x00\x7f\u202e\n\t") == "a\\x1b[31mb\\x07\\x9b1m\\x00\\x7f\\u202e\n\t"
    assert PlainConsole().render_str("[/x] \x1b[2J", markup=True).plain == "[/x] \\x1b[2J"


def test_best_prints_a_tables_hostile_text_literally(tmp_path):
    """Guards `best` against markup and control sequences in a table's cells (MarkupError traceback before)."""
    table = tmp_path / "best.csv"
    row = read_table(REPO / "tests" / "report" / "data" / "best-v2.csv").head(1)
    shape = f"{row.m[0]}x{row.n[0]}x{row.k[0]}_"  # a row's name begins with its shape
    row.assign(problem=shape + " ".join(HOSTILE), kernel=HOSTILE[2], runtime=HOSTILE[3], gpu=HOSTILE[0]).to_csv(
        table, index=False)
    done = _cli("best", "--storage", table)
    assert done.returncode == 0, done.stderr
    _shown_literally(done.stdout)
    saved = tmp_path / "best.txt"
    assert _cli("best", "--storage", table, "-o", saved).returncode == 0
    _shown_literally(saved.read_text())


def test_compile_prints_a_hostile_compiler_message_literally(tmp_path):
    """Guards FAILED lines against markup and control sequences in nvcc's message, fresh and cached."""
    env = {**os.environ, "CUTLASS_TUNE_NVCC": str(FAKE_NVCC), "CUTLASS_TUNE_CACHE_DIR": str(tmp_path),
           "FAKE_NVCC_FAIL_IF": "namespace", "FAKE_NVCC_FAIL_MESSAGE": " ".join(HOSTILE)}
    for _ in ("compiled", "cached"):
        done = _cli("compile", "configs/quick.yaml", "--limit", "1", env=env)
        # stderr holds the progress line of a pipe alone: the message is shown literally on stdout
        assert done.returncode == 1 and re.fullmatch(r"\S+ \S+ compiling 0/1: nvcc on \S+\n\S+ \S+ compiling 1/1\n",
                                                     done.stderr), done.stderr
        assert "FAILED bf16_tn_128x256x64" in done.stdout
        _shown_literally(done.stdout)


def test_space_prints_a_hostile_file_name_and_key_literally(tmp_path):
    """Guards `space` against markup and control sequences in its file's path and in its one-line errors."""
    path = tmp_path / "[" / "bold] [with T=int] [link=x]text[" / "link] \x1b[31mred\x1b]8;;x\x07.yaml"
    path.parent.mkdir(parents=True)
    path.write_text((REPO / "configs" / "quick.yaml").read_text())
    done = _cli("space", path, "--list")
    assert done.returncode == 0, done.stderr
    _shown_literally(done.stdout, [visible(path)])
    path.write_text('problems: {m: 64, n: 64, k: 64}\n"[/bold] \\e[31mred\\e]8;;http://x\\a": 1\n')  # YAML escapes
    done = _cli("space", path)
    assert done.returncode == 2 and done.stdout == ""
    _shown_literally(done.stderr, ["unknown key", "[/bold] \\x1b[31mred\\x1b]8;;http://x\\x07"])


def _sweep_state():
    from types import SimpleNamespace
    config = SimpleNamespace(name=HOSTILE[2], hash="abc")
    problem = SimpleNamespace(problem=SimpleNamespace(name=" ".join(HOSTILE[:2])), measured=3, failed=1,
                              cublas_tflops=600.0, best_tflops=650.0, best_ratio=1.08, best_at=2,
                              best_config=config)
    return SimpleNamespace(compiled=4, queued=2, invalid=0, lost=[HOSTILE[3]], problems=[problem])


@pytest.mark.parametrize("terminal", [True, False], ids=["live-table", "log-lines"])
def test_the_sweep_display_shows_a_stores_hostile_text_literally(terminal):
    """Guards the sweep's table and log lines against markup and control sequences in a store's names and reasons."""
    sink = io.StringIO()
    console = PlainConsole(file=sink, width=400, force_terminal=terminal, color_system=None)
    if terminal:
        console.print(sweep_table(_sweep_state()))
    else:
        SweepLog(console)(_sweep_state())
    _shown_literally(sink.getvalue())


def _store_with_a_hostile_damaged_row(tmp_path: Path) -> Path:
    import shutil
    import sqlite3
    copy = tmp_path / "damaged.sqlite"
    shutil.copy(STORE, copy)
    with sqlite3.connect(copy) as db:  # an out-of-range m: the row is left out with a DamagedRowWarning
        db.execute("update ct_measurements set m = -5, problem = ? where id = (select min(id) from "
                   "ct_measurements where status = 'ok' and config_hash is not null)", ("x" + HOSTILE[3],))
    return copy


@pytest.mark.skipif(not STORE.exists(), reason="needs the committed H200 store")
def test_the_damaged_row_warning_of_best_shows_the_rows_text_literally(tmp_path):
    """Guards `best`'s DamagedRowWarning (printed through logging) against a row's control sequences."""
    done = _cli("best", "--storage", _store_with_a_hostile_damaged_row(tmp_path))
    assert done.returncode == 0 and "DamagedRowWarning" in done.stderr, done.stderr
    _shown_literally(done.stderr, [SHOWN[3]])


@pytest.mark.skipif(not STORE.exists(), reason="needs the committed H200 store")
def test_load_best_warns_of_a_damaged_row_in_visible_text(tmp_path):
    """Guards `load_best`'s Python warning (an API user's stderr) against a row's control sequences."""
    from cutlass_tune.report import load_best
    from cutlass_tune.report._best import DamagedRowWarning
    with pytest.warns(DamagedRowWarning) as caught:
        load_best(_store_with_a_hostile_damaged_row(tmp_path))
    (message,) = [str(w.message) for w in caught if w.category is DamagedRowWarning]
    _shown_literally(message, [SHOWN[3]])


def test_the_verbose_log_line_of_space_shows_a_file_name_literally(tmp_path):
    """Guards `-v space`'s INFO line (logging, not the console) against a file name's control sequences."""
    path = tmp_path / "\x1b]0;T\x07\x1b[2J.yaml"
    path.write_text((REPO / "configs" / "quick.yaml").read_text())
    done = _cli("-v", "space", path)
    assert done.returncode == 0 and "counting the configs" in done.stderr, done.stderr
    _shown_literally(done.stderr, [visible(path)])
