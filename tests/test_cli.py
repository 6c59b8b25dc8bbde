import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cutlass_tune import __version__
from cutlass_tune.settings import DEFAULT_STORE

from .cli_run import cli

REPO = Path(__file__).resolve().parents[1]


def run(*args, **kw):
    if set(kw) <= {"cwd"}:  # in this process: the command's output and exit code
        return cli(*args, **kw)
    return subprocess.run([sys.executable, "-m", "cutlass_tune.cli", *map(str, args)],
                          capture_output=True, text=True, **{"cwd": REPO, **kw})


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
    assert second.returncode == 0 and "compiled 0, cached 3, failed 0" in second.stdout


def test_failed_kernels_exit_1_with_their_log(tmp_path):
    env = {**__import__("os").environ, "CUTLASS_TUNE_NVCC": str(REPO / "tests/compile/fake_nvcc.py"),
           "CUTLASS_TUNE_CACHE_DIR": str(tmp_path), "FAKE_NVCC_FAIL_IF": "namespace"}
    r = run("compile", "configs/quick.yaml", "--limit", "1", env=env)
    assert r.returncode == 1
    assert "FAILED bf16_tn_128x256x64" in r.stdout and "planted failure" in r.stdout
    assert "log:" in r.stdout and "unit.cu" in r.stdout


def one_line_error(r, code=2):
    """The message of a command that failed with `code` and one line on stderr, nothing on stdout."""
    lines = r.stderr.splitlines()
    assert (r.returncode, r.stdout, len(lines)) == (code, "", 1), r.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize("args, expected", [
    (["sweep", "configs/quick.yaml", "--trials", "0"], "sweep: Invalid value for '--trials'"),
    (["compile", "configs/quick.yaml", "--jobs", "abc"], "Invalid value for '--jobs'"),
    (["confirm", "--top", "0"], "Invalid value for '--top'"),
    (["export", "--storage", "x.csv"], "Missing option '--output'"),
    (["warp"], "No such command 'warp'"),
])
def test_usage_errors_are_one_line(args, expected):
    # Guards against click's four-line usage block, which breaks the one-line rule.
    assert expected in one_line_error(run(*args))


def test_an_output_that_is_the_source_is_refused_and_the_store_kept(tmp_path):
    # Guards against `best -o STORE` / `dashboard -o STORE` replacing the store with the report.
    store = tmp_path / "s.sqlite"
    store.write_bytes((REPO / "results" / "sweep-nvidia-h200.sqlite").read_bytes())
    before = store.read_bytes()
    for args in (["best", "--format", "csv"], ["dashboard"]):
        line = one_line_error(run(*args, "--storage", store, "-o", store))
        assert line == f"error: -o {store} is the file the results are read from: write elsewhere"
    assert store.read_bytes() == before


@pytest.mark.parametrize("output, expected", [
    ("folder", "is a folder"),
    ("plain/x.csv", "plain is a file, not a folder"),
    ("", "give a file name"),
])
@pytest.mark.parametrize("command", [["best", "--format", "csv"], ["dashboard"]])
def test_unwritable_outputs_are_refused_before_any_work(tmp_path, output, expected, command):
    (tmp_path / "folder").mkdir()
    (tmp_path / "plain").write_text("x")
    r = run(*command, "--storage", REPO / "results" / "sweep-nvidia-h200.sqlite", "-o",
            tmp_path / output if output else "", cwd=tmp_path)
    assert expected in one_line_error(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "plain"]


def test_environment_settings_must_be_finite_positive_numbers():
    for name, value in (("CUTLASS_TUNE_NVCC_MEMORY_GB", "nan"), ("CUTLASS_TUNE_COMPILE_TIMEOUT", "inf"),
                        ("CUTLASS_TUNE_JOBS", "0"), ("CUTLASS_TUNE_JOBS", "two")):
        r = run("compile", "configs/quick.yaml", env={**__import__("os").environ, name: value})
        line = one_line_error(r)
        assert line.startswith(f"error: {name}={value!r}") and ("finite positive" in line or "not a" in line)


def test_a_cache_folder_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "plain").write_text("x")
    env = {**__import__("os").environ, "CUTLASS_TUNE_NVCC": str(REPO / "tests/compile/fake_nvcc.py")}
    r = run("compile", "configs/quick.yaml", "--limit", "1", "--cache-dir", tmp_path / "plain", env=env)
    assert "Not a directory" in one_line_error(r)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks what a host without a GPU is told")
def test_a_sweep_that_cannot_start_leaves_no_store_behind(tmp_path):
    r = run("sweep", "configs/quick.yaml", "--storage", f"sqlite:///{tmp_path}/new/x.sqlite")
    assert "no CUDA GPU is visible" in one_line_error(r)
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_refuses_what_it_could_never_run_before_looking_for_a_gpu(tmp_path):
    bad = tmp_path / "invalid.yaml"
    bad.write_text("problems: {m: 4096, n: 4096, k: 4096}\nkernels: {tile_m: 64, kernel_schedule: cooperative}\n")
    assert "no valid config to tune" in one_line_error(run("sweep", bad))
    assert "--timeout inf: give a number of seconds" in one_line_error(run("sweep", "configs/quick.yaml",
                                                                           "--timeout", "inf"))
    (tmp_path / "plain").write_text("x")
    line = one_line_error(run("sweep", "configs/quick.yaml", "--storage", f"sqlite:///{tmp_path}/plain/x.sqlite"))
    assert "plain is a file, not a folder" in line


def test_without_storage_the_reading_commands_read_the_default_store(tmp_path):
    for command in (["best"], ["dashboard"], ["export", "-o", "b"], ["confirm"]):
        assert one_line_error(run(*command, cwd=tmp_path)).startswith(
            f"error: give --storage: the default store {DEFAULT_STORE} is not here"), command
    assert list(tmp_path.iterdir()) == []
    store = REPO / "results" / "sweep-nvidia-h200.sqlite"
    r = run("best", "--format", "csv", cwd=tmp_path, env={**os.environ, "CUTLASS_TUNE_STORE": str(store)})
    assert r.returncode == 0 and "4096x4096x4096_bf16bf16bf16_tn" in r.stdout


def test_best_writes_its_table_to_a_file_whole(tmp_path):
    out = tmp_path / "best.txt"
    r = run("best", "--storage", REPO / "results" / "sweep-nvidia-h200.sqlite", "-o", out)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    text = out.read_text()
    assert "4096x4096x4096_bf16bf16bf16_tn" in text and "ratio" in text.splitlines()[0]
    assert [p.name for p in tmp_path.iterdir()] == ["best.txt"]  # no temporary file left


def test_version():
    r = run("--version")
    assert (r.returncode, r.stdout, r.stderr) == (0, f"cutlass-tune {__version__}\n", "")


@pytest.mark.parametrize("command, choices", [("best", "table|csv|json|parquet"), ("sweep", "tpe|gp|random|grid")])
def test_closed_choices_are_listed_in_the_help_and_checked(command, choices):
    assert choices in run(command, "--help").stdout
    option = "--format" if command == "best" else "--sampler"
    line = one_line_error(run(command, *(["configs/quick.yaml"] if command == "sweep" else []), option, "nope"))
    assert f"Invalid value for '{option}'" in line


def test_the_sampler_choices_are_the_search_samplers():
    from cutlass_tune.cli._sweep import Sampler
    from cutlass_tune.search import SAMPLERS

    assert tuple(s.value for s in Sampler) == tuple(SAMPLERS)


@pytest.mark.parametrize("command", ["space", "best", "dashboard", "export", "shapes"])
def test_the_commands_without_a_gpu_do_not_import_torch(tmp_path, command):
    # Guards against `best` spending seconds importing torch, which only measuring needs. `shapes`
    # imports it to run a model (tests/test_capture.py), not to show its help.
    store = REPO / "results" / "sweep-nvidia-h200.sqlite"
    args = {"space": ["configs/quick.yaml"], "best": ["--storage", store], "shapes": ["--help"],
            "dashboard": ["--storage", store, "-o", tmp_path / "r.html"],
            "export": ["--storage", store, "-o", tmp_path / "b", "--cache-dir", tmp_path / "cache"]}[command]
    env = {**os.environ, "CUTLASS_TUNE_NVCC": str(REPO / "tests/compile/fake_nvcc.py")}
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "cutlass_tune.cli", command, *map(str, args)],
                       capture_output=True, text=True, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    imported = set(re.findall(r"^import time:.*\|\s+([\w.]+)$", r.stderr, re.MULTILINE))
    assert "torch" not in imported


def test_space_counts_the_moe_configs():
    r = run("space", "configs/moe_bf16.yaml")
    assert r.returncode == 0, r.stderr
    assert "12 problems" in r.stdout.splitlines()[0] and "grouped_schedule" in r.stdout


@pytest.mark.parametrize("args, expected", [
    (["--shapes", "e4:64x64x64", "--routing", "pareto"], "error: --routing = 'pareto': give uniform or zipf"),
    (["--shapes", "64x64x64", "--routing", "zipf"], "error: --routing: goes with MoE shapes"),
    (["--shapes", "e0:64x64x64"], "experts must be a whole number from 1 to 4096"),
    (["configs/moe_bf16.yaml", "--routing", "zipf"], "error: --routing: goes with MoE shapes"),
])
def test_bad_grouped_sweep_options_are_one_line_and_exit_2(args, expected):
    assert expected in one_line_error(run("sweep", *args))


def test_space_previews_the_shapes_a_sweep_would_tune():
    # Guards the README's first sweep (`sweep --shapes ...`) against having no preview: space takes its options.
    r = run("space", "--shapes", "4096x4608x3584")
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"--shapes: 1 problems, \d+ configs: \d+ valid, \d+ invalid", r.stdout.splitlines()[0])
    r = run("space", "--shapes", "e8:4096x1536x2048", "--routing", "zipf")
    assert r.returncode == 0 and "grouped_schedule" in r.stdout, r.stderr
    r = run("space")
    assert r.returncode != 0 and "space: give a search-space file or --shapes" in r.stderr
    options = ("--shapes", "--dtype", "--layout", "--epilogue", "--scaling", "--routing")
    assert all(o in re.sub(r"\x1b\[[0-9;]*m", "", run("space", "--help").stdout) for o in options)


def test_verbose_shows_the_stages_info_lines_with_timestamps_and_quiet_hides_warnings():
    # Guards -v/-q: INFO lines (e.g. what the prior was fitted on) show only when asked, stamped for a pipe.
    assert "counting the configs" not in run("space", "configs/quick.yaml").stderr
    r = run("-v", "space", "configs/quick.yaml")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO cutlass_tune.cli._space: counting the configs of "
                     r"configs/quick.yaml", r.stderr, re.MULTILINE), r.stderr
    r = run("-q", "space", "configs/quick.yaml")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = run("-q", "-v", "space", "configs/quick.yaml")
    assert r.returncode == 2 and "--verbose and --quiet: give one" in r.stderr


def test_every_environment_variable_settings_reads_is_in_the_help():
    # Guards against variables no user can learn of: each one of settings.py's table shows in --help.
    from cutlass_tune import settings

    names = re.findall(r"^\| (CUTLASS_TUNE_\w+) \|", settings.__doc__, re.MULTILINE)
    assert len(names) >= 6
    shown = run("--help").stdout + run("compile", "--help").stdout + run("best", "--help").stdout
    assert [n for n in names if n not in shown] == []
    assert "CUTLASS_TUNE_JOBS" in run("export", "--help").stdout
