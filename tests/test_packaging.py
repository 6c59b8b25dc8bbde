"""The wheel: its package list names every package of the source tree, and it carries the data
the package reads (the prior's committed measurements)."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent


def test_every_subpackage_is_listed_for_the_wheel():
    # Regression guard: pyproject lists packages by hand, and a new stage left out of it would be
    # missing from the installed wheel while every test run from the checkout still passed.
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "cutlass_tune").rglob("__init__.py")}
    assert found <= listed, f"not in pyproject's packages: {sorted(found - listed)}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of this checkout (an in-tree build would leave build/ here)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", "tests", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "*.so"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp), str(source)], check=True, capture_output=True, text=True)
    (built,) = tmp.glob("cutlass_tune-*.whl")
    return built


def test_the_wheel_carries_the_prior_s_measurements_and_no_store(wheel):
    # Regression: results/measurements.csv.gz was not shipped, so an installed `kernels: auto`
    # sweep fitted its prior on the user's empty store without a word.
    names = zipfile.ZipFile(wheel).namelist()
    assert "cutlass_tune/results/measurements.csv.gz" in names
    assert not [n for n in names if n.endswith((".sqlite", ".jsonl"))]  # the committed stores (30 MB) stay out


def test_the_wheel_carries_the_native_operators_sources(wheel):
    # Regression guard: a host that installs the wheel builds the operators' extension from them.
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {f"cutlass_tune/native/{p.name}" for p in (ROOT / "cutlass_tune" / "native").iterdir()}
    assert shipped and shipped <= set(names), sorted(shipped - set(names))


def test_an_installed_native_source_folder_is_found(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = "from cutlass_tune.kernel._native import native_sources; print(native_sources())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True,
                          env={**os.environ, "PYTHONPATH": str(site)})
    assert Path(done.stdout.strip()) == site / "cutlass_tune" / "native"


def test_the_wheel_carries_py_typed(wheel):
    # Regression: no py.typed was shipped, so a user's mypy saw the whole (strictly typed) API as Any.
    assert "cutlass_tune/py.typed" in zipfile.ZipFile(wheel).namelist()


def test_an_installed_prior_reads_its_measurements_from_the_package(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # a pure-Python wheel installs as its unpacked files
    code = ("import logging, cutlass_tune; logging.basicConfig(level=logging.INFO)\n"
            "from cutlass_tune.measurement import TimingMethod\n"
            "from cutlass_tune.search import _prior, _prior_strategy\n"
            "print(cutlass_tune.__file__); print(_prior.COMMITTED)\n"
            "print(len(_prior_strategy.load_committed('NVIDIA H200', TimingMethod.EVENTS)))\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                          check=True)
    module, data, count = done.stdout.split()
    assert Path(module).is_relative_to(site) and Path(data) == site / "cutlass_tune/results/measurements.csv.gz"
    assert int(count) > 1000
    assert f"prior's committed measurements (GEMMs): {data}" in done.stderr


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The wheel unpacked as pip would install it (a pure-Python wheel installs as its files)."""
    site = tmp_path_factory.mktemp("installed") / "site"
    zipfile.ZipFile(wheel).extractall(site)
    return site


def _cli(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "cutlass_tune.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env)


@pytest.mark.parametrize("name", ["configs/quick.yaml", "quick.yaml", "squares_fp8.yaml"])
def test_an_installed_space_reads_a_shipped_config_from_any_folder(installed, tmp_path, name):
    # Regression: `space configs/quick.yaml` failed outside a checkout though the wheel ships the file.
    done = _cli(installed, tmp_path, "space", name)
    assert done.returncode == 0, done.stderr
    shipped = installed / "cutlass_tune" / "configs" / Path(name).name
    assert done.stderr == f"{name} is not here: reading the copy shipped with cutlass-tune, {shipped}\n"
    assert done.stdout.startswith(f"{shipped}: ") and " valid" in done.stdout


def test_a_file_in_the_folder_wins_over_the_shipped_one_and_a_missing_one_is_an_error(installed, tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "quick.yaml").write_text("problems: [{m: 128, n: 128, k: 64}]\n"
                                                     "kernels: {tile_m: [128], tile_n: [128], tile_k: [64]}\n")
    done = _cli(installed, tmp_path, "space", "configs/quick.yaml")
    assert done.returncode == 0 and done.stderr == "" and done.stdout.startswith("configs/quick.yaml: 1 problems")
    missing = _cli(installed, tmp_path, "space", "elsewhere/quick.yaml")  # a folder of the user's: never replaced
    assert missing.returncode == 2 and "elsewhere/quick.yaml" in missing.stderr


def test_installed_help_points_at_files_the_wheel_has(installed, tmp_path):
    # Regression: help pointed at configs/README.md and docs/*.md, which a wheel user does not have.
    text = "".join(_cli(installed, tmp_path, *c, "--help").stdout
                   for c in (["space"], ["sweep"], ["compile"], ["bench"], ["confirm"], ["shapes"]))
    assert "docs/" not in text and "configs/README.md" not in text
    assert (installed / "cutlass_tune" / "configs" / "README.md").is_file()
    env = {**os.environ, "PYTHONPATH": str(installed), "COLUMNS": "400"}
    wide = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "space", "--help"], capture_output=True,
                          text=True, cwd=tmp_path, env=env).stdout
    assert f"README.md, are in {installed / 'cutlass_tune' / 'configs'}" in wide
