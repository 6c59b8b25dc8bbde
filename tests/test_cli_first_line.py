"""No silent minutes: a long command says what it does before the slow part begins (a compile,
the walk of kernels: auto), and a sweep on a host with no GPU says so before importing torch."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cutlass_tune import _devices
from cutlass_tune.cli import _space
from cutlass_tune.space import _auto

REPO = Path(__file__).resolve().parent.parent
FAKE_NVCC = REPO / "tests/compile/fake_nvcc.py"
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "


@pytest.mark.parametrize("hidden", ["", "-1", "-1,0"])
def test_cuda_visible_devices_that_hides_every_gpu_is_no_gpu(monkeypatch, hidden):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
    assert _devices.surely_no_gpu()


def test_a_sweep_without_a_gpu_says_so_before_importing_torch_or_walking_the_space():
    # Regression: `sweep --shapes` took 12 s (torch's import, then the walk of kernels: auto) to say no GPU is visible.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "cutlass_tune.cli", "sweep", "--shapes",
                           "4096x4096x4096"], capture_output=True, text=True, cwd=REPO, env=env)
    imported = [line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    said = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert done.returncode == 2 and said == [f"error: {_devices.NO_GPU_MESSAGE}"], done.stderr
    assert "torch" not in imported and "cutlass_tune.search" not in imported and "cutlass_tune.bench" not in imported


def test_space_says_what_it_counts_before_the_walk(monkeypatch, capsys):
    # Regression: `space --shapes` was silent for the 11 s of its walk.
    def walked(self):
        raise RuntimeError(f"walked after saying: {capsys.readouterr().err!r}")

    monkeypatch.setattr(_auto.AutoKernels, "census", walked)
    with pytest.raises(RuntimeError) as caught:
        _space.space(config=None, shapes="4096x4096x4096", dtype=None, layout=None, epilogue=None, scaling=None,
                     routing=None, list_=False)
    said = str(caught.value)
    assert re.search(r"counting the [\d,]+ configs of kernels: auto for 1 operation \(bf16bf16bf16_tn\)", said), said


def _first_lines(args, n, **env_extra):
    """The first `n` lines of stderr and whether the command was still running when they came."""
    env = {**os.environ, "CUTLASS_TUNE_NVCC": str(FAKE_NVCC), "FAKE_NVCC_SLEEP": "4", **env_extra}
    p = subprocess.Popen([sys.executable, "-m", "cutlass_tune.cli", *map(str, args)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        lines = [p.stderr.readline().rstrip("\n") for _ in range(n)]
        running = p.poll() is None
        p.wait(120)
    finally:
        p.kill()
    return lines, running


def test_compile_says_what_nvcc_compiles_while_it_runs(tmp_path):
    # Regression: `compile --limit 1` was silent for the 61 s nvcc took after its first line.
    (line,), running = _first_lines(["compile", "configs/quick.yaml", "--limit", "1", "--cache-dir", tmp_path], 1)
    assert running and re.fullmatch(f"{STAMP}compiling 0/1: nvcc on bf16_tn_\\S+", line), line


def test_export_says_each_step_before_its_compiles_end(tmp_path):
    # Regression: `export` printed nothing for the 94 s of its first compile.
    store = REPO / "results" / "sweep-nvidia-h200.sqlite"
    lines, running = _first_lines(["export", "--storage", store, "-o", tmp_path / "b", "--cache-dir",
                                   tmp_path / "c"], 1)
    assert running, lines
    assert re.fullmatch(f"{STAMP}compiling 0/\\d: nvcc on bf16_tn_\\S+, .*", lines[0]), lines
