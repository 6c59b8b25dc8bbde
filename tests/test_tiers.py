"""The fast tier (`-m "not nvcc and not postgresql and not gpu"`) passes on a host without nvcc:
tests/conftest.py fails any test without the nvcc mark that runs nvcc, however it finds it."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBES = '''
import subprocess, sys
import pytest
from cutlass_tune.compile import find_toolchain


def test_through_the_toolchain():
    with pytest.raises(Exception):
        find_toolchain()


def test_through_the_cli():
    subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "compile", "--help"], check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "compile", "REPO/configs/quick.yaml"],
                   capture_output=True)


def test_on_path():
    subprocess.run(["nvcc", "--version"], capture_output=True)


def test_a_fake_of_its_own(monkeypatch):
    monkeypatch.setenv("CUTLASS_TUNE_NVCC", "REPO/tests/compile/fake_nvcc.py")
    assert find_toolchain().nvcc.endswith("fake_nvcc.py")


@pytest.mark.nvcc
def test_marked():
    pass
'''


def test_a_test_without_the_nvcc_mark_that_runs_nvcc_fails(tmp_path):
    # Regression: 13 sweep tests compiled real kernels unmarked (their patch missed the CLI's
    # name); the fast tier then ran nvcc for minutes, and failed on a host without it.
    (tmp_path / "tests").mkdir()
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "test_probes.py").write_text(PROBES.replace("REPO", str(REPO)))
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUTLASS_TUNE_NVCC": str(REPO / "tests/compile/fake_nvcc.py")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "tests"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    errors = {line.split("::")[1].split()[0] for line in done.stdout.splitlines() if line.startswith("ERROR ")}
    assert errors == {"test_through_the_toolchain", "test_through_the_cli", "test_on_path"}, done.stdout
    assert "ran nvcc without the nvcc mark" in done.stdout
    assert "PASSED tests/test_probes.py::test_a_fake_of_its_own" in done.stdout
    assert "PASSED tests/test_probes.py::test_marked" in done.stdout
