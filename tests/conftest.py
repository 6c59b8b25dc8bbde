"""Test-suite settings, read from the environment (the package's own are in cutlass_tune/settings.py):

| variable | meaning |
|---|---|
| CUTLASS_TUNE_TEST_POSTGRES_URL | a PostgreSQL server for the store's contract tests (`.ci/postgres.sh` starts one) |
| CUTLASS_TUNE_TEST_REQUIRE | needs (nvcc, postgresql) whose absence fails the run instead of skipping |
| CUTLASS_TUNE_TEST_STARTED | set by tests/bench/test_worker.py for the worker it starts; not for users |
"""

import os
import shlex
import shutil
import uuid

import pytest
import sqlalchemy as sa

POSTGRES_ENV = "CUTLASS_TUNE_TEST_POSTGRES_URL"

_TEMP_ROOT_ROOM = 4 * 2**30


def _temp_root_in_memory() -> None:
    """Put pytest's numbered temporary folders (`tmp_path`) on /dev/shm where it is a writable,
    executable RAM filesystem with a few GiB free, unless the caller chose a root: the SQLite
    stores the tests build commit thousands of times, and each commit waits on the disk (10 ms
    on a virtual disk: a 60-trial sweep test spent 60 s in commits). Nothing a test asserts
    depends on the disk; pytest keeps the last three runs' folders there, as under /tmp."""
    shm = "/dev/shm"
    if "PYTEST_DEBUG_TEMPROOT" in os.environ or not os.path.isdir(shm) or not os.access(shm, os.W_OK | os.X_OK):
        return
    try:
        fs = os.statvfs(shm)
    except OSError:
        return
    if fs.f_flag & os.ST_NOEXEC or fs.f_bavail * fs.f_frsize < _TEMP_ROOT_ROOM:
        return  # tests run the fake nvcc and GPU scripts they write there
    os.environ["PYTEST_DEBUG_TEMPROOT"] = shm


_temp_root_in_memory()


def _hopper_visible() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and torch.cuda.get_device_capability(0)[0] == 9


REQUIRE_ENV = "CUTLASS_TUNE_TEST_REQUIRE"
"""Space-separated needs (nvcc, postgresql) whose absence fails the run instead of skipping
tests: CI sets it, so a lost compiler or database cannot pass as a green run of skips."""


def _required(need: str) -> bool:
    return need in os.environ.get(REQUIRE_ENV, "").split()


def pytest_collection_modifyitems(config, items):
    from cutlass_tune import settings

    has_gpu = _hopper_visible()
    nvcc = settings.nvcc_path()
    has_nvcc = nvcc is not None and shutil.which(nvcc) is not None
    if _required("nvcc") and not has_nvcc:
        raise pytest.UsageError(f"{REQUIRE_ENV} needs nvcc, and none was found (PATH, CUTLASS_TUNE_NVCC, CUDA_HOME)")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a Hopper (SM90) GPU; none is visible"))
        if "nvcc" in item.keywords and not has_nvcc:
            item.add_marker(pytest.mark.skip(reason="needs nvcc (PATH, CUTLASS_TUNE_NVCC or CUDA_HOME)"))


@pytest.fixture(scope="session")
def _nvcc_guard(tmp_path_factory):
    """An `nvcc` that records each call and fails as a missing compiler would, and its record."""
    folder = tmp_path_factory.mktemp("nvcc-guard")
    guard, calls = folder / "nvcc", folder / "calls"
    guard.write_text(f"#!/bin/sh\necho \"nvcc $*\" >> {shlex.quote(str(calls))}\n"
                     "echo 'nvcc: this test has no nvcc mark' >&2\nexit 1\n")
    guard.chmod(0o755)
    return guard, calls


@pytest.fixture(autouse=True)
def _no_nvcc_without_the_mark(request, monkeypatch, _nvcc_guard):
    """A test without the `nvcc` mark must pass on a host without nvcc, so it may not run the
    host's: it finds the guard instead (CUTLASS_TUNE_NVCC, and first on PATH, for this process
    and those it starts), and fails if it ran it. A test's own fake nvcc, set in the test, wins.
    Regression: 13 sweep tests patched a name the CLI did not call and compiled real kernels.
    A `gpu` test is outside the fast tier and runs only on a GPU host, where it may build the
    kernels it measures: the guard leaves it alone."""
    if "nvcc" in request.keywords or "gpu" in request.keywords:
        yield
        return
    from cutlass_tune.compile import find_toolchain

    find_toolchain.cache_clear()  # a toolchain an nvcc test found (cached) would skip the guard
    guard, calls = _nvcc_guard
    before = calls.stat().st_size if calls.exists() else 0
    monkeypatch.setenv("CUTLASS_TUNE_NVCC", str(guard))
    # Nor g++: `export` builds the operators' native library unless this says no (and the
    # operators then keep their Python path, whatever a user's cache holds), unless the run
    # asks for the native library with CUTLASS_TUNE_NATIVE=1 (tests/runtime/test_native.py).
    if os.environ.get("CUTLASS_TUNE_NATIVE") != "1":
        monkeypatch.setenv("CUTLASS_TUNE_NATIVE", "0")
    monkeypatch.setenv("PATH", f"{guard.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    yield
    ran = calls.read_text()[before:] if calls.exists() else ""
    if ran:
        pytest.fail(f"ran nvcc without the nvcc mark (fake the compiler, or mark the test nvcc): {ran.strip()}")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)])
def store_url(request, tmp_path):
    """A fresh, empty store URL on each backend. PostgreSQL needs CUTLASS_TUNE_TEST_POSTGRES_URL
    (.ci/run starts a server and sets it); its cases carry the `postgresql` marker, so
    `-m "not postgresql"` leaves them out."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.sqlite'}"
        return
    admin_url = os.environ.get(POSTGRES_ENV)
    if not admin_url:
        if _required("postgresql"):
            pytest.fail(f"{REQUIRE_ENV} needs postgresql: set {POSTGRES_ENV}")
        pytest.skip(f"set {POSTGRES_ENV} to a PostgreSQL server (.ci/run starts one)")
    name = f"ct_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield sa.engine.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(autouse=True)
def _tables_of_any_hopper(request, monkeypatch):
    """GPU tests check kernels' results with tables tuned on one Hopper (the committed H200
    stores) whichever Hopper runs them: there, a table's rows serve every GPU model (the GPU
    check itself is tested on the CPU, tests/runtime/test_gpu_check.py)."""
    if "gpu" in request.keywords:
        from cutlass_tune.runtime._table import BestTable

        monkeypatch.setattr(BestTable, "for_gpu", lambda self, name: self)
