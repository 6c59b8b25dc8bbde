"""`cutlass-tune sweep --gpu I --gpu J`: one benchmark worker per GPU, on scripted GPUs."""

import os
import re
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

import cutlass_tune.bench
import cutlass_tune.compile
from cutlass_tune.bench import TimingOptions, WorkerStartError
from cutlass_tune.cli import app
from cutlass_tune.errors import CutlassTuneError
from cutlass_tune.store import ResultStore

from .fakes import FakeBench, FakeCompiler
from .test_sweep import SPACE

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "
"""The time a progress line to a log starts with."""


class Gpu(FakeBench):
    """Stands in for WorkerBenchmarker(device): `models` names the model of each device."""

    models = {}
    started = []
    lose = {}  # device -> measurements after which it cannot start a worker again

    def __init__(self, device):
        if device not in self.models:
            raise CutlassTuneError(f"GPU {device} is not visible")
        super().__init__()
        self.device, self.gpu_name, self.timing, self.closed = device, self.models[device], TimingOptions(), False
        Gpu.started.append(self)

    @property
    def scheme(self):
        return self.timing.scheme


    def measure(self, kernel, problem, variants, bar=None):
        for v in variants:
            if len(self.measured) >= self.lose.get(self.device, float("inf")):
                raise WorkerStartError(f"benchmark worker for GPU {self.device} exited with code 1 while starting")
            time.sleep(0.002)  # as long as a measurement takes, the other GPU takes the next task
            yield from super().measure(kernel, problem, [v])

    def close(self):
        self.closed = True


@pytest.fixture
def gpus(monkeypatch):
    Gpu.models, Gpu.started, Gpu.lose = {0: "Fake GPU", 1: "Fake GPU"}, [], {}
    monkeypatch.setattr(cutlass_tune.bench, "WorkerBenchmarker", Gpu)
    monkeypatch.setattr(cutlass_tune.compile, "compile_kernels", lambda cfgs, **kw: FakeCompiler()(cfgs))
    # Regression: the command called its own imported name, so the patch missed and nvcc ran.
    monkeypatch.setenv("CUTLASS_TUNE_NVCC", "/nonexistent/nvcc")
    # The fake GPUs stand in for real ones: the command's early no-GPU check must not refuse first.
    monkeypatch.setattr(cutlass_tune.cli._sweep, "surely_no_gpu", lambda: False)
    return Gpu


def sweep(tmp_path, *args):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    result = CliRunner().invoke(app, ["sweep", str(space), "--storage", url, "--trials", "4", "--jobs", "2",
                                      "--cache-dir", str(tmp_path / "cache"), *args], terminal_width=250)
    return result, url


def test_two_gpus_both_measure_and_both_are_closed(tmp_path, gpus):
    r, url = sweep(tmp_path, "--gpu", "0", "--gpu", "1")
    assert r.exit_code == 0, r.output
    assert "2 x Fake GPU (GPUs 0, 1)" in r.output.splitlines()[0]
    lines = r.output.splitlines()
    assert lines[-1].startswith("stopped: trial budget reached")  # not run into the table
    # not a terminal: progress comes as lines while the sweep runs, then the table; each line stamped with
    # its time (regression: a log of the sweep did not say when anything happened)
    progress = [line for line in lines if re.match(STAMP + "compiled ", line) and "pairs measured" in line]
    assert len(progress) >= 4 and progress[-1].endswith("8 kernel-problem pairs measured, 0 failed")
    best = [line for line in lines if re.match(STAMP + "best 4096x4096x4096_bf16bf16bf16_tn: ", line)]
    assert best and re.search(r": \d\.\d{3} of cuBLAS, \d+\.\d TFLOP/s, bf16_tn_\w+ \(config \d\)$", best[0])
    assert lines.index(progress[-1]) < lines.index(next(line for line in lines if line.startswith("problem ")))
    a, b = gpus.started
    assert (a.device, b.device) == (0, 1) and a.measured and b.measured
    assert len(a.measured) + len(b.measured) == 4 * 2 * 4
    assert a.closed and b.closed
    rows = [row for row in ResultStore(url).rows() if row.kernel != "cuBLAS"]
    assert len(rows) == 4 * 2 * 4


def test_gpus_of_two_models_are_refused_before_the_store_is_touched(tmp_path, gpus):
    gpus.models[1] = "Other GPU"
    r, url = sweep(tmp_path, "--gpu", "0", "--gpu", "1")
    assert isinstance(r.exception, CutlassTuneError) and "Other GPU (132 SMs) beside Fake GPU" in str(r.exception)
    assert all(g.closed for g in gpus.started) and not any(g.measured for g in gpus.started)
    assert ResultStore(url).rows() == []


def test_a_gpu_that_cannot_start_closes_the_others(tmp_path, gpus):
    r, _ = sweep(tmp_path, "--gpu", "0", "--gpu", "7")
    assert isinstance(r.exception, CutlassTuneError) and str(r.exception) == "GPU 7 is not visible"
    assert [g.device for g in gpus.started] == [0] and gpus.started[0].closed


def test_a_gpu_named_twice_is_one_line_and_exit_2(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    r = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "sweep", str(space), "--gpu", "1", "--gpu", "1"],
                       capture_output=True, text=True)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", "error: --gpu 1 given more than once\n")


def test_a_gpu_lost_mid_sweep_is_named_and_the_sweep_finishes_on_the_other(tmp_path, gpus):
    gpus.lose[1] = 3
    r, url = sweep(tmp_path, "--gpu", "0", "--gpu", "1")
    assert r.exit_code == 0, r.output
    assert ("given up mid-sweep: benchmark worker for GPU 1 exited with code 1 while starting; "
            "the other GPUs measured what it left") in r.output
    assert re.search(f"^{STAMP}given up: benchmark worker for GPU 1 exited with code 1 while starting$", r.output,
                     re.MULTILINE)  # when it happened
    assert "\nstopped: trial budget reached" in r.output
    a, b = gpus.started
    assert len(b.measured) == 3 and len(a.measured) == 4 * 2 * 4 - 3
    assert a.closed and b.closed
    assert len([row for row in ResultStore(url).rows() if row.kernel != "cuBLAS"]) == 4 * 2 * 4


def test_a_lone_gpu_lost_is_an_error_of_one_line(tmp_path, gpus):
    gpus.lose[0] = 3
    r, url = sweep(tmp_path)
    assert isinstance(r.exception, CutlassTuneError)
    assert str(r.exception) == "benchmark worker for GPU 0 exited with code 1 while starting"
    assert gpus.started[0].closed
    assert len([row for row in ResultStore(url).rows() if row.kernel != "cuBLAS"]) == 3


def test_proposals_left_to_another_sweep_are_counted_when_it_stops(tmp_path, gpus):
    from cutlass_tune.search import seed_configs
    from cutlass_tune.space import load_space

    from .test_shared_store import claim_for

    (tmp_path / "space.yaml").write_text(SPACE)
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    space = load_space(tmp_path / "space.yaml")
    held = [c.hash for c in seed_configs(space, ResultStore(url), list(space.problems), "Fake GPU")[:2]]
    claim_for(url, "other-host-run", held, host="gpu-host-7", pid=1)
    r, _ = sweep(tmp_path, "--gpu", "0")
    assert r.exit_code == 0, r.output
    last = r.output.strip().splitlines()[-1]
    assert re.fullmatch(r"stopped: trial budget reached; run [0-9a-f]{12}; 2 of its proposals left to another "
                        r"sweep on the store, which was measuring them", last), last


def sweep_shapes(tmp_path, *args):
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    result = CliRunner().invoke(app, ["sweep", *args, "--storage", url, "--jobs", "2",
                                      "--cache-dir", str(tmp_path / "cache")], terminal_width=250)
    return result, url


@pytest.fixture
def no_committed(monkeypatch, tmp_path):
    from cutlass_tune.search import _prior

    monkeypatch.setattr(_prior, "COMMITTED", tmp_path / "missing.csv.gz")


def test_shapes_alone_sweep_every_valid_config_led_by_the_prior(tmp_path, gpus, no_committed):
    r, url = sweep_shapes(tmp_path, "--shapes", "1024x1280x8192,256x4096x4096", "--trials", "3")
    assert r.exit_code == 0, r.output
    first = r.output.splitlines()[0]
    assert first.startswith("--shapes: 2 problems, 190240 valid configs; Fake GPU;") and "sampler tpe" in first
    assert "\nstopped: trial budget reached" in r.output
    rows = [row for row in ResultStore(url).rows() if row.kernel != "cuBLAS"]
    assert {row.problem for row in rows} == {"1024x1280x8192_bf16bf16bf16_tn", "256x4096x4096_bf16bf16bf16_tn"}
    assert len({row.config_hash for row in rows}) == 3


def test_shapes_over_a_file_take_its_knobs_and_the_strategy_named(tmp_path, gpus, no_committed):
    (tmp_path / "space.yaml").write_text(SPACE)
    r, url = sweep_shapes(tmp_path, str(tmp_path / "space.yaml"), "--shapes", "2048x2048x2048", "--layout", "nt",
                          "--strategy", "prior", "--trials", "2")
    assert r.exit_code == 0, r.output
    assert "space.yaml --shapes: 1 problems, " in r.output.splitlines()[0]
    assert "strategy prior, sampler tpe" in r.output.splitlines()[0]
    assert {row.problem for row in ResultStore(url).rows()} == {"2048x2048x2048_bf16bf16bf16_nt"}


@pytest.mark.parametrize("args, expected", [
    ([], "error: sweep: give a search-space file or --shapes MxNxK[,MxNxK...]\n"),
    (["--shapes", "64x64"], "error: --shapes = '64x64': give each shape as MxNxK, e.g. 4096x4096x4096, "
     "or MoE experts as eE:ROWSxNxK, e.g. e128:32768x1536x2048 (dwE:ROWSxNxK for their weight gradients)\n"),
    (["--dtype", "f16"], "error: --dtype: goes with --shapes (a space file gives its own types and layouts)\n"),
])
def test_a_sweep_without_a_space_is_one_line_and_exit_2(args, expected):
    # refused before a GPU is looked for (none is visible here)
    r = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "sweep", *args],
                       capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert (r.returncode, r.stdout, r.stderr) == (2, "", expected)


def test_the_strategy_choices_are_the_search_strategies():
    from cutlass_tune.cli._sweep import Strategy
    from cutlass_tune.search import STRATEGIES

    assert {s.value for s in Strategy} == set(STRATEGIES)  # the shipped ones; a registered one is for the API
