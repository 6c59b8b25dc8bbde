"""Paths with `~` (a cache, a store) and operands that are not tensors: expanded, or one line naming the problem."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cutlass_tune
from cutlass_tune.compile import KernelCache
from cutlass_tune.errors import CutlassTuneError
from cutlass_tune.runtime import MatmulInputError
from cutlass_tune.store import open_store

REPO = Path(__file__).resolve().parent.parent.parent
STORE = REPO / "results" / "llama33b-nvidia-h200.sqlite"
FAKE_NVCC = REPO / "tests" / "compile" / "fake_nvcc.py"


def test_cache_dir_with_a_tilde_is_the_home_folder(tmp_path, monkeypatch):
    # Regression: --cache-dir '~/x' made a folder literally named `~` in the working directory.
    monkeypatch.setenv("HOME", str(tmp_path))
    assert KernelCache.at(Path("~/kernels")).root.parent == tmp_path / "kernels"


def test_an_unknown_users_home_is_one_error(monkeypatch):
    monkeypatch.setenv("CUTLASS_TUNE_CACHE_DIR", "~nosuchuser/x")
    with pytest.raises(CutlassTuneError, match="nosuchuser"):
        KernelCache.at(None)


@pytest.mark.parametrize("env,args", [
    ({"CUTLASS_TUNE_CACHE_DIR": "~nosuchuser/x"}, []),
    ({}, ["--cache-dir", "~nosuchuser/x"]),
])
def test_the_cli_says_so_in_one_line(env, args):
    # Regression: CUTLASS_TUNE_CACHE_DIR='~nosuchuser/x' was a RuntimeError traceback. The fake nvcc: the
    # command looks for nvcc first, and the cache's error must show on a host without one too.
    env = {**os.environ, "CUTLASS_TUNE_NVCC": str(FAKE_NVCC), **env}
    done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "compile", str(REPO / "configs" / "quick.yaml"),
                           *args], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "nosuchuser" in done.stderr


@pytest.mark.parametrize("given", ["--storage=~/s.sqlite", "CUTLASS_TUNE_STORE=~/s.sqlite"])
def test_a_store_given_with_a_tilde_is_in_the_home_folder(tmp_path, given):
    # Regression: `--storage=~/s.sqlite` (a shell expands no `~` after `=`) or CUTLASS_TUNE_STORE='~/s.sqlite'
    # looked for a folder named `~` in the working directory: "no store at sqlite:///~/s.sqlite".
    (tmp_path / "home").mkdir()
    shutil.copy(STORE, tmp_path / "home" / "s.sqlite")
    option, value = given.split("=", 1)
    args, env = ([given], {}) if option.startswith("--") else ([], {option: value})
    done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "best", "--format", "csv", *args],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "HOME": str(tmp_path / "home"), **env})
    assert done.returncode == 0 and done.stdout.startswith("gpu,problem,"), done.stderr
    assert not (tmp_path / "~").exists()


def test_a_new_store_given_with_a_tilde_is_made_in_the_home_folder(tmp_path, monkeypatch):
    # Regression: `sweep --storage=~/runs/s.sqlite` made its store under a folder named `~` in the working directory.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    open_store("~/runs/s.sqlite", new=True).bind_gpu("NVIDIA H200")
    assert (tmp_path / "home" / "runs" / "s.sqlite").is_file() and not (tmp_path / "~").exists()


def test_a_store_in_an_unknown_users_home_is_one_line():
    done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "best", "--storage", "~nosuchuser/s.sqlite"],
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (2, "error: --storage='~nosuchuser/s.sqlite': ~nosuchuser is no "
                                                 "user's home here\n")


@pytest.mark.skipif(not STORE.exists(), reason="needs the committed H200 store")
@pytest.mark.parametrize("a,b,named", [
    ([[1.0]], [[1.0]], "a must be a torch.Tensor, not list"),
    (np.ones((16, 16)), np.ones((16, 16)), "a must be a torch.Tensor, not ndarray"),
])
def test_matmul_names_an_operand_that_is_not_a_tensor(a, b, named):
    # Regression: a list or NumPy array raised AttributeError ('list' object has no attribute 'shape').
    table = cutlass_tune.BestTable.load(STORE)
    with pytest.raises(MatmulInputError, match=named):
        cutlass_tune.matmul(a, b, table=table)


@pytest.mark.parametrize("command", ["best", "dashboard"])
def test_an_output_given_with_a_tilde_is_written_in_the_home_folder(tmp_path, command):
    # Regression: --output=~/x (no shell expands ~ after =) wrote ./~/x, or failed to.
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    store = REPO / "results" / "llama33b-nvidia-h200.sqlite"
    done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", command, "--storage", str(store),
                           "--output=~/out.txt"], capture_output=True, text=True, timeout=120, cwd=work,
                          env={**os.environ, "HOME": str(home)})
    assert done.returncode == 0, done.stderr
    assert (home / "out.txt").stat().st_size > 0 and not (work / "~").exists()
    unknown = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", command, "--storage", str(store),
                              "--output=~nosuchuser/out.txt"], capture_output=True, text=True, timeout=120, cwd=work)
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == "error: --output='~nosuchuser/out.txt': ~nosuchuser is no user's home here"
