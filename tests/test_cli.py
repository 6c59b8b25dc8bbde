import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "cutlass_tune.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=REPO, **kw)


def test_space_counts_the_broad_config():
    r = run("space", "configs/sm90_bf16.yaml")
    assert r.returncode == 0
    first = r.stdout.splitlines()[0]
    assert "3 problems, 3888 configs" in first and "valid" in first
    assert "cooperative_tile_m" in r.stdout and "stream_k_schedule" in r.stdout


def test_space_list_shows_each_config():
    r = run("space", "configs/quick.yaml", "--list")
    assert r.returncode == 0
    assert r.stdout.count("  valid") == 6


@pytest.mark.parametrize("text,expected", [
    ("problems: [{m: 1\n", "malformed YAML"),
    ("problems: {m: 64, n: 64, k: 64}\ncolour: red\n", "colour = 'red': unknown key"),
    ("problems: {m: 64, n: 64, k: 64}\nkernels: {tile_m: 100}\n", "kernels.0.tile_m.0 = 100: tile M must be"),
    ("problems: {m: 64, n: 64, k: 64}\nkernels: {cluster: 3x3}\n", "kernels.0.cluster.0 = '3x3': cluster M and N"),
    ("problems: {m: 64, n: 64, k: 64}\nkernels: {stages: 1}\n", "kernels.0.stages.0 = 1: stages must be"),
    ("problems: {m: 64, n: 64, k: 64}\nkernels: {kernel_schedule: warp_drive}\n",
     "kernels.0.kernel_schedule.0 = 'warp_drive': Input should be"),
    ("problems: {m: 64, n: 64, k: 100}\n", "TMA needs"),
])
@pytest.mark.parametrize("command", ["space", "compile"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, text, expected, command):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    r = run(command, path)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {path}") and expected in lines[0]


def test_missing_nvcc_is_one_line(tmp_path):
    r = run("compile", "configs/quick.yaml", env={"PATH": "/nonexistent", "CUTLASS_TUNE_NVCC": "",
                                                  "CUDA_HOME": str(tmp_path), "HOME": str(tmp_path)})
    assert r.returncode == 2
    assert r.stderr.strip() == "error: nvcc not found: install the CUDA toolkit or set CUTLASS_TUNE_NVCC"


def test_compile_reports_counts_with_a_fake_nvcc(tmp_path):
    env = {**__import__("os").environ, "CUTLASS_TUNE_NVCC": str(REPO / "tests/compile/fake_nvcc.py"),
           "CUTLASS_TUNE_CACHE_DIR": str(tmp_path)}
    first = run("compile", "configs/quick.yaml", "--limit", "3", "-j", "2", env=env)
    assert first.returncode == 0, first.stderr
    assert "compiled 3, cached 0, failed 0" in first.stdout and "kernels/min" in first.stdout
    second = run("compile", "configs/quick.yaml", "--limit", "3", env=env)
    assert "compiled 0, cached 3, failed 0" in second.stdout


def test_failed_kernels_exit_1_with_their_log(tmp_path):
    env = {**__import__("os").environ, "CUTLASS_TUNE_NVCC": str(REPO / "tests/compile/fake_nvcc.py"),
           "CUTLASS_TUNE_CACHE_DIR": str(tmp_path), "FAKE_NVCC_FAIL_IF": "namespace"}
    r = run("compile", "configs/quick.yaml", "--limit", "1", env=env)
    assert r.returncode == 1
    assert "FAILED bf16_tn_128x256x64" in r.stdout and "planted failure" in r.stdout
    assert "log:" in r.stdout and "unit.cu" in r.stdout
