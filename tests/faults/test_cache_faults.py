"""Faults of the kernel cache and the compiler: a damaged library is never served, a failure
that says nothing about the kernel is never cached, and no nvcc outlives its run."""

import json
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

from cutlass_tune.compile import KernelCache, compile_kernels, intact, kernel_key
from cutlass_tune.compile._cache import DIGEST, record_digest
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
    # what stderr said before the signal is the compile's progress ("compiling 0/6: nvcc on ...")
    *progress, last = err.splitlines()
    assert (run.returncode, last) == (130, "interrupted") and all("compiling" in line for line in progress), err
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


@pytest.mark.parametrize("broken", ["tmpdir", "host_compiler"])
def test_a_broken_shell_is_not_the_kernels_error(fake_toolchain, cache, nvcc_calls, monkeypatch, tmp_path, broken):
    # Guards against a missing TMPDIR or host compiler cached as compile_error (a good shell then failing in 0.0 s).
    if broken == "tmpdir":
        monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))
        first, = _build(cache, fake_toolchain)  # nvcc's temporary files go to the build folder
        assert first.status is Status.OK
        return
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("FAKE_NVCC_HOST_CHECK", "1")
    with monkeypatch.context() as shell:
        shell.setenv("PATH", str(bare))
        failed, = _build(cache, fake_toolchain)
    assert failed.status is Status.COMPILE_ERROR and failed.transient
    assert failed.reason.startswith("environment, not the kernel: ")
    assert failed.reason.endswith("(no gcc or g++ on PATH)")
    retried, = _build(cache, fake_toolchain)
    assert retried.status is Status.OK and not retried.cached and len(nvcc_calls()) == 2


@pytest.mark.parametrize(("said", "transient"), [
    ("nvcc fatal   : Could not open output file '/gone/tmpxft_00002952_0000000a'", True),
    ("gcc: No such file or directory\nnvcc fatal   : Failed to preprocess host compiler properties.", True),
    ("nvcc error   : 'cicc' died due to signal 9 (Kill signal)", True),
    ("nvcc error   : 'ptxas' died with status 0xC0000005 (ACCESS_VIOLATION)", True),
    ('unit.cu(3): catastrophic error: cannot open source file "cutlass/cutlass.h"', True),
    ("unit.cu:3:10: fatal error: cute/tensor.hpp: No such file or directory", True),
    ("ptxas fatal   : Memory allocation failure", True),
    ("", True),
    ('unit.cu(12): error: identifier "x" is undefined', False),
    ("/cutlass/include/cute/atom.hpp(40): error: static assertion failed with \"bad tile\"", False),
    ("ptxas error   : Entry function '_Z3k' uses too much shared data (0x40000 bytes, 0x38000 max)", False),
])
def test_what_nvcc_says_decides_whether_a_failure_is_cached(fake_toolchain, cache, nvcc_calls, monkeypatch, said,
                                                            transient):
    # Guards against an environment's failure cached as the kernel's, and a kernel's error retried for ever.
    monkeypatch.setenv("FAKE_NVCC_SAY_IF", kernel_symbol(CONFIG))
    monkeypatch.setenv("FAKE_NVCC_SAY", said)
    failed, = _build(cache, fake_toolchain)
    assert failed.status is Status.COMPILE_ERROR and failed.transient is transient
    assert _build(cache, fake_toolchain)[0].cached is not transient


@pytest.mark.parametrize(("variable", "why"), [
    ("FAKE_NVCC_GARBAGE_IF", "kernels.so: it is not an ELF file"),
    ("FAKE_NVCC_NO_ABI_IF", "kernels.so does not export cutlass_tune_abi_version"),
])
def test_a_bogus_library_from_an_nvcc_that_exits_0_is_not_cached(fake_toolchain, cache, nvcc_calls, monkeypatch,
                                                                 variable, why):
    # Guards against an "nvcc" writing an 11-byte non-ELF .so served as a cached kernel for good.
    monkeypatch.setenv(variable, kernel_symbol(CONFIG))
    failed, = _build(cache, fake_toolchain)
    assert failed.status is Status.COMPILE_ERROR and failed.transient and failed.reason == f"nvcc exited 0 but {why}"
    monkeypatch.delenv(variable)
    retried, = _build(cache, fake_toolchain)
    assert retried.status is Status.OK and not retried.cached and len(nvcc_calls()) == 2


def test_a_cached_library_that_is_not_one_is_rebuilt(fake_toolchain, cache, nvcc_calls):
    # Guards against a library whose digest matches (rewritten with it) served without the ABI check.
    library = _build(cache, fake_toolchain)[0].library
    library.write_bytes(b"not an elf\n")
    record_digest(library.parent)
    again, = _build(cache, fake_toolchain)
    assert again.status is Status.OK and not again.cached and len(nvcc_calls()) == 2


@pytest.mark.parametrize("escape", ["unit_key", "symlinked_unit", "symlinked_library"])
def test_an_entry_leading_outside_the_cache_is_refused(fake_toolchain, cache, nvcc_calls, tmp_path, escape):
    # Guards against a shared cache's entry making us load an arbitrary file.
    kernel, = _build(cache, fake_toolchain)
    outside = tmp_path / "outside"
    shutil.copytree(kernel.library.parent, outside)
    if escape == "unit_key":
        entry_path = cache._entry_path(kernel.key)
        entry = json.loads(entry_path.read_text())
        entry["unit"] = os.path.relpath(outside, cache.root / "units")
        entry_path.write_text(json.dumps(entry))
    elif escape == "symlinked_unit":
        shutil.rmtree(kernel.library.parent)
        kernel.library.parent.symlink_to(outside)
    else:
        kernel.library.unlink()
        kernel.library.symlink_to(outside / "kernels.so")
    assert cache.lookup(kernel.key, CONFIG) is None
    again, = _build(cache, fake_toolchain)
    assert again.status is Status.OK and not again.cached and len(nvcc_calls()) == 2


_WAITER = """
import signal, sys
from pathlib import Path
from cutlass_tune.compile import KernelCache, Toolchain, compile_kernels
from cutlass_tune.compile._toolchain import cutlass_source_root
from cutlass_tune.space import KernelConfig
def interrupt(number, frame):
    raise KeyboardInterrupt
# As the CLI does, for both: a parent that started this in the background (a CI job run from a
# script with `&`) may have left SIGINT ignored, and the child inherits that.
signal.signal(signal.SIGTERM, interrupt)
signal.signal(signal.SIGINT, interrupt)
toolchain = Toolchain(nvcc=sys.argv[1], nvcc_version="99.0.1", cutlass_root=cutlass_source_root(),
                      cutlass_version="4.2.0")
print("ready", flush=True)
try:
    compile_kernels([KernelConfig(tile_n=64)], cache=KernelCache(Path(sys.argv[2])), toolchain=toolchain, jobs=1)
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_compile_waiting_on_anothers_lock_stops_on_an_interrupt(fake_toolchain, tmp_path, stop):
    # Guards against a compile behind another process's kernel lock ignoring Ctrl-C and SIGTERM until it frees.
    cache = KernelCache(tmp_path / "cache")
    with cache.lock(kernel_key(CONFIG, fake_toolchain)):
        waiter = subprocess.Popen([sys.executable, "-c", _WAITER, str(FAKE_NVCC), str(tmp_path / "cache")],
                                  stdout=subprocess.PIPE, text=True, cwd=REPO,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})
        assert waiter.stdout.readline() == "ready\n"
        time.sleep(1.0)  # into the wait for the lock
        waiter.send_signal(stop)
        start = time.monotonic()
        assert waiter.wait(timeout=20) == 130
        assert time.monotonic() - start < 5


def test_nvcc_stages_die_with_a_compile_killed_by_sigkill(tmp_path):
    # Guards against nvcc's running stage (cicc, cudafe++) outliving a SIGKILLed compile by seconds.
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {**os.environ, "FAKE_NVCC_SLEEP": "60", "FAKE_NVCC_PID_DIR": str(pids), "FAKE_NVCC_STAGE": "1"}
    parent = subprocess.Popen([sys.executable, "-c", _ORPHAN, str(FAKE_NVCC), str(tmp_path / "cache")], env=env)
    deadline = time.monotonic() + 30
    while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    processes = [int(p.name.removeprefix("stage-")) for p in pids.iterdir()]
    assert len(processes) == 2, "no stage started"
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while any(_running(p) for p in processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(p) for p in processes)
