"""Paths with `~` and operands that are not tensors: expanded, or one line naming the problem."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cutlass_tune
from cutlass_tune.compile import KernelCache
from cutlass_tune.errors import CutlassTuneError
from cutlass_tune.runtime import MatmulInputError

REPO = Path(__file__).resolve().parent.parent.parent
STORE = REPO / "results" / "llama33b-nvidia-h200.sqlite"


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
    # Regression: CUTLASS_TUNE_CACHE_DIR='~nosuchuser/x' was a RuntimeError traceback.
    done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "compile", str(REPO / "configs" / "quick.yaml"),
                           *args], capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "nosuchuser" in done.stderr


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
