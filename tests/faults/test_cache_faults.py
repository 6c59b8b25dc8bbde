"""Faults of the kernel cache and the compiler: a damaged library is never served, a failure
that says nothing about the kernel is never cached, and no nvcc outlives its run."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from cutlass_tune.compile import compile_kernels, intact
from cutlass_tune.compile._cache import DIGEST
from cutlass_tune.render import kernel_symbol
from cutlass_tune.report import write_bundle
from cutlass_tune.search import Sweep, SweepSettings
from cutlass_tune.space import KernelConfig
from cutlass_tune.status import Status
from cutlass_tune.store import ResultStore
from cutlass_tune.tables import BundleError

from ..compile.conftest import FAKE_NVCC
from ..search.fakes import FakeBench, FakeCompiler, space_of

SWEEP_SPACE = """
problems: {m: 4096, n: 4096, k: 4096}
kernels: {tile_m: [128], tile_n: [128, 256], cluster: [1x1, 2x1]}
"""

CONFIG = KernelConfig(tile_n=64)
REPO = Path(__file__).resolve().parents[2]


def _build(cache, toolchain, configs=(CONFIG,)):
    return compile_kernels(list(configs), cache=cache, toolchain=toolchain, jobs=1, kernels_per_unit=1)


@pytest.mark.parametrize("damage", ["truncate", "garble", "digest"])
def test_a_damaged_library_is_rebuilt_in_place_not_served(fake_toolchain, cache, nvcc_calls, damage):
    # Guards against a truncated kernels.so reported "cached" (and loading it killing the process).
    first, = _build(cache, fake_toolchain)
    library = first.library
    if damage == "truncate":
        os.truncate(library, library.stat().st_size // 2)
    elif damage == "garble":
        library.write_bytes(b"X" * library.stat().st_size)  # same size, other bytes
    else:
        (library.parent / DIGEST).write_text("{not json")
    assert not intact(library.parent)
    again, = _build(cache, fake_toolchain)
    assert again.status is Status.OK and not again.cached and len(nvcc_calls()) == 2
    assert again.library == library and intact(library.parent)  # the fresh build replaced the damaged one
    served, = _build(cache, fake_toolchain)
    assert served.cached and len(nvcc_calls()) == 2


@pytest.mark.parametrize("library", ["/bin/true", "built"])
def test_a_library_without_its_digest_is_rebuilt_not_served(fake_toolchain, cache, nvcc_calls, library):
    # Guards against any ELF file passing as a cached kernel (and being exported, then loaded) once
    # library.json beside it is deleted.
    unit = _build(cache, fake_toolchain)[0].library.parent
    (unit / DIGEST).unlink()
    if library != "built":
        shutil.copyfile(library, unit / "kernels.so")
    assert not intact(unit)
    again, = _build(cache, fake_toolchain)
    assert again.status is Status.OK and not again.cached and len(nvcc_calls()) == 2 and intact(unit)


def test_export_refuses_a_library_damaged_after_it_was_looked_up(fake_toolchain, cache, tmp_path):
    # Guards against a bundle shipping a damaged library with the damaged file's SHA-256.
    kernel, = _build(cache, fake_toolchain)
    os.truncate(kernel.library, 3)
    frame = pd.DataFrame([{"config_hash": CONFIG.hash, "kernel": CONFIG.name, "gpu": "any"}])
    with pytest.raises(BundleError, match="is damaged"):
        write_bundle(frame, [kernel], tmp_path / "bundle", {})
    assert not (tmp_path / "bundle").exists()


@pytest.mark.parametrize(("variable", "reason"), [
    ("FAKE_NVCC_KILL_IF", "nvcc was killed by SIGKILL (out of memory?)"),
    ("FAKE_NVCC_DISK_FULL_IF", "disk full while building: nvlink fatal   : Could not write"),
])
def test_a_failure_of_the_machine_is_not_cached(fake_toolchain, cache, nvcc_calls, monkeypatch, variable, reason):
    # Guards against nvcc killed by the OOM killer, or a full disk, stored as a permanent compile_error.
    monkeypatch.setenv(variable, kernel_symbol(CONFIG))
    failed, = _build(cache, fake_toolchain)
    assert failed.status is Status.COMPILE_ERROR and failed.transient and failed.reason.startswith(reason)
    monkeypatch.delenv(variable)
    retried, = _build(cache, fake_toolchain)
    assert retried.status is Status.OK and not retried.cached and len(nvcc_calls()) == 2


def test_a_compiler_diagnosis_is_still_cached(fake_toolchain, cache, nvcc_calls, monkeypatch):
    monkeypatch.setenv("FAKE_NVCC_FAIL_IF", kernel_symbol(CONFIG))
    failed, = _build(cache, fake_toolchain)
    assert failed.status is Status.COMPILE_ERROR and not failed.transient
    assert _build(cache, fake_toolchain)[0].cached and len(nvcc_calls()) == 1


def test_build_folders_of_dead_processes_are_removed(fake_toolchain, cache):
    host = socket.gethostname().replace("-", "_")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = cache.root / "tmp" / f"build-{host}-{dead}-abc"
    live = cache.root / "tmp" / f"build-{host}-{os.getpid()}-abc"
    for folder in (stale, live):
        folder.mkdir()
        (folder / "unit.cu").write_text("// half-built")
    _build(cache, fake_toolchain)
    assert not stale.exists() and live.exists()


_ORPHAN = """
import sys
from pathlib import Path
from cutlass_tune.compile import KernelCache, Toolchain, compile_kernels
from cutlass_tune.compile._toolchain import cutlass_source_root
from cutlass_tune.search import Sweep, SweepSettings
from cutlass_tune.space import KernelConfig
from cutlass_tune.store import ResultStore
toolchain = Toolchain(nvcc=sys.argv[1], nvcc_version="99.0.1", cutlass_root=cutlass_source_root(),
                      cutlass_version="4.2.0")
compile_kernels([KernelConfig(tile_n=64)], cache=KernelCache(Path(sys.argv[2])), toolchain=toolchain, jobs=1)
"""


def test_nvcc_dies_with_a_compile_killed_by_sigkill(tmp_path):
    # Guards against nvcc jobs left running as orphans when cutlass-tune is killed.
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {**os.environ, "FAKE_NVCC_SLEEP": "60", "FAKE_NVCC_PID_DIR": str(pids)}
    parent = subprocess.Popen([sys.executable, "-c", _ORPHAN, str(FAKE_NVCC), str(tmp_path / "cache")], env=env)
    deadline = time.monotonic() + 30
    while not list(pids.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    child, = (int(p.name) for p in pids.iterdir())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(child)


@pytest.mark.parametrize("stop", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_hang_up_or_termination_stops_a_compile_and_its_nvcc(tmp_path, stop):
    # Guards against a closed terminal or a dropped ssh session (SIGHUP), or a batch system's
    # SIGTERM, leaving the command's nvcc jobs running or its build folders behind.
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {**os.environ, "CUTLASS_TUNE_NVCC": str(FAKE_NVCC), "FAKE_NVCC_SLEEP": "60", "FAKE_NVCC_PID_DIR": str(pids)}
    run = subprocess.Popen([sys.executable, "-m", "cutlass_tune.cli", "compile", str(REPO / "configs" / "quick.yaml"),
                            "--cache-dir", str(tmp_path / "cache"), "-j", "2"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(pids.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    children = [int(p.name) for p in pids.iterdir()]
    assert children, "no nvcc started"
    run.send_signal(stop)
    _, err = run.communicate(timeout=30)
    assert (run.returncode, err) == (130, "interrupted\n")
    deadline = time.monotonic() + 5
    while any(_running(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(c) for c in children)
    assert not [p for p in (tmp_path / "cache").rglob("tmp/*")]


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing


def test_a_sweep_stores_no_transient_failure_and_compiles_it_again(tmp_path):
    # Guards against a sweep's store keeping nvcc's death as the kernel's outcome (resume skipped it).
    space = space_of(tmp_path, SWEEP_SPACE)
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    killed = FakeCompiler(transient_tile_n=128)
    Sweep(space, ResultStore(url), url, killed, FakeBench(), SweepSettings(trials=4, batch=2)).run()
    tried = {c.hash for call in killed.calls for c in call if c.tile_n == 128}
    stored = {r.config_hash for r in ResultStore(url).rows() if r.config_hash}
    assert tried and not tried & stored
    again = FakeCompiler()
    Sweep(space, ResultStore(url), url, again, FakeBench(), SweepSettings(trials=4, batch=2)).run()
    assert tried <= {c.hash for call in again.calls for c in call}


def test_units_are_as_readable_as_the_umask_allows(fake_toolchain, cache):
    # Guards against units made 0700 (by mkdtemp), which another user sharing the cache cannot read.
    old = os.umask(0o022)
    try:
        unit = _build(cache, fake_toolchain)[0].library.parent
    finally:
        os.umask(old)
    assert unit.stat().st_mode & 0o777 == 0o755
