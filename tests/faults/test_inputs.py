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


@pytest.mark.parametrize("model", [42, None], ids=["int", "None"])
def test_patch_of_something_not_a_module_is_one_error(model):
    """Guards `patch(42)` / `patch(None)` (AttributeError: no attribute 'named_modules')."""
    from cutlass_tune.runtime import patch

    with pytest.raises(MatmulInputError, match=f"^patch takes a torch.nn.Module, not {type(model).__name__}$"):
        patch(model, STORE)


@pytest.mark.parametrize("features", [(-16, 128), (128, 0), (128.0, 128)], ids=["negative", "zero", "float"])
def test_fp8_linear_of_sizes_not_positive_integers_is_one_error(features):
    """Guards `Fp8Linear(-16, ..)` (torch's RuntimeError from zeros of a negative size)."""
    from cutlass_tune.runtime import Fp8Linear

    with pytest.raises(MatmulInputError, match=r"^Fp8Linear: \w+_features .* is not a positive integer$"):
        Fp8Linear(*features, table=STORE)


def test_use_table_of_a_data_frame_names_what_it_takes():
    """Guards `use_table(DataFrame)` ("File name too long": the frame's text taken as a path)."""
    from cutlass_tune import load_best
    from cutlass_tune.transformers import use_table

    with pytest.raises(MatmulInputError, match=r"^use_table takes a BestTable or a path, not DataFrame \("):
        use_table(load_best(STORE))


MODEL_FILE = """
import os
import torch

class Stop(BaseException):
    pass

class Model(torch.nn.Module):
    def forward(self, x):
        raise Stop("stopped in forward")

def exits():
    os._exit(0)

def generator_exit():
    raise GeneratorExit

def forward_raises():
    return Model(), (torch.zeros(2, 2),)
"""


@pytest.mark.parametrize(("function", "said"), [
    ("exits", "exits() raised os._exit(0) (it must return, not end the process)"),
    ("generator_exit", "generator_exit() raised GeneratorExit"),
    ("forward_raises", "the model raised Stop: stopped in forward on meta"),
])
def test_shapes_on_a_model_function_that_ends_the_process_or_raises_a_base_exception_is_one_line(
        function, said, tmp_path):
    """Guards `shapes` against a model file's os._exit(0) (exit 0, nothing said) and its BaseException
    (GeneratorExit, a class of its own: a traceback)."""
    model = tmp_path / "model.py"
    model.write_text(MODEL_FILE)
    done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "shapes", f"{model}:{function}", "-o",
                           tmp_path / "out"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2 and done.stderr.startswith("error: "), (done.returncode, done.stderr[-2000:])
    assert len(done.stderr.splitlines()) == 1 and said in done.stderr, done.stderr
