"""`cutlass-tune best` on screens of any width and on a pipe: a kernel name is never cut."""

import io
import subprocess
import sys
from pathlib import Path

import pytest

from cutlass_tune.cli import _best
from cutlass_tune.cli._console import PlainConsole
from cutlass_tune.report import load_best

REPO = Path(__file__).resolve().parent.parent
FUSED = REPO / "benchmarks/results/session_h200_20261127b/fused_ops/fused-ops-nvidia-h200.sqlite.gz"
GROUPED = REPO / "benchmarks/results/session_h200_20261127b/fp8_grouped/moe-fp8-blockwise-nvidia-h200.sqlite.gz"


def on_terminal(monkeypatch, store, width, *, wide=False, capsys=None) -> str:
    """What `best --storage store` prints on a terminal `width` columns wide."""
    screen = io.StringIO()
    monkeypatch.setattr(_best, "out", PlainConsole(file=screen, width=width, force_terminal=True, soft_wrap=True,
                                                   color_system=None))
    _best.best(storage=str(store), fmt=_best.TableFormat.TABLE, output=None, wide=wide)
    return screen.getvalue() + (capsys.readouterr().out if capsys else "")


@pytest.mark.parametrize("store", [FUSED, GROUPED], ids=["fused", "grouped"])
def test_at_80_columns_a_row_is_one_line_with_its_whole_kernel_name(monkeypatch, store):
    # Regression: at 80 columns every column was cut and each row folded to six lines.
    frame = load_best(store)
    lines = on_terminal(monkeypatch, store, 80).splitlines()
    assert lines[0].split() == ["ratio", "TFLOP/s", "problem", "kernel"]
    rows = lines[1:-1]
    assert len(rows) == len(frame)
    for line, r in zip(rows, frame.to_dict("records")):
        assert line.split() == [f"{r['ratio']:.3f}", f"{r['tflops']:.1f}", r["problem"], r["kernel"]]
    assert "--wide" in lines[-1]


def test_a_terminal_wide_enough_gets_every_column(monkeypatch, capsys):
    text = on_terminal(monkeypatch, FUSED, 400, capsys=capsys)
    assert text.splitlines()[0].split()[:3] == ["gpu", "problem", "TFLOP/s"] and "run-time" in text


def test_wide_shows_every_column_whole_at_80_columns(monkeypatch, capsys):
    text = on_terminal(monkeypatch, GROUPED, 80, wide=True, capsys=capsys)
    assert "run-time" in text.splitlines()[0]
    for r in load_best(GROUPED).to_dict("records"):
        assert r["kernel"] in text and r["problem"] in text


@pytest.mark.parametrize("store", [FUSED, GROUPED], ids=["fused", "grouped"])
def test_a_pipe_gets_every_column_and_whole_names(store):
    # Regression: on a pipe the table was 220 columns wide and long kernel names were cut.
    done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "best", "--storage", str(store)],
                          capture_output=True, text=True, cwd=REPO, check=True)
    lines = done.stdout.splitlines()
    # every column; a store with per-regime figures (clocks of its confirm passes) adds their column last
    assert lines[0].split()[:11] == ["gpu", "problem", "TFLOP/s", "baseline", "its", "TFLOP/s", "ratio", "spread",
                                     "confirmed", "kernel", "run-time"]
    for line, r in zip(lines[1:], load_best(store).to_dict("records")):
        assert f"  {r['problem']}  " in line and f"  {r['kernel']}  " in line
        assert line.endswith(r["runtime"]) or f"  {r['runtime']}  " in line
    assert "…" not in done.stdout
