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
