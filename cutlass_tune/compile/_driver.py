"""Compile kernel configs to shared objects: parallel nvcc, bounded by cores and memory.

Several kernels can share one translation unit (`kernels_per_unit`): each unit costs one
front-end pass over the CUTLASS headers, so batching saves CPU time, but a unit takes longer
wall time than one kernel alone. The automatic policy batches only when there are more kernels
than parallel slots (benchmarks/compile_throughput.md has the measurements behind it). When a
batched unit fails, its kernels are rebuilt one per unit so each failure is attributed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import dataclasses
import errno
import hashlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import filelock

from .. import settings
from ..errors import RenderError
from ..kernel._elf import library_problem
from ..render import kernel_symbol, render_unit
from ..space import KernelConfig, check_config
from ..status import Status
from ._cache import CompiledKernel, KernelCache
from ._toolchain import Toolchain, find_toolchain

MAX_KERNELS_PER_UNIT = 4
_LOCK_POLL_S = 0.2

ProgressCallback = Callable[[CompiledKernel], None]


def kernel_key(cfg: KernelConfig, toolchain: Toolchain) -> str:
    """Cache key of one kernel: its rendered source (alone in a unit) and the toolchain."""
    source = render_unit([cfg]).source
    return hashlib.sha256((toolchain.fingerprint + source).encode()).hexdigest()


def _available_memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def default_jobs() -> int:
    """Parallel nvcc jobs: CUTLASS_TUNE_JOBS, else min(cores, available memory / per-job peak)."""
    requested = settings.compile_jobs()
    if requested:
        return requested
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    memory = _available_memory_bytes()
    by_memory = memory // settings.nvcc_memory_bytes() if memory else cores
    return max(1, min(cores, by_memory))


def plan_units(configs: Sequence[KernelConfig], jobs: int, kernels_per_unit: int | None) -> list[list[KernelConfig]]:
    """Group configs into translation units. `kernels_per_unit=None` picks automatically: one
    per unit while every kernel gets its own slot, otherwise just enough per unit to fill the
    slots, at most MAX_KERNELS_PER_UNIT."""
    if not configs:
        return []
    if kernels_per_unit is None:
        kernels_per_unit = min(MAX_KERNELS_PER_UNIT, max(1, math.ceil(len(configs) / jobs)))
    return [list(configs[i:i + kernels_per_unit]) for i in range(0, len(configs), kernels_per_unit)]


_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def spill_bytes_by_symbol(log: str, symbols: Iterable[str]) -> dict[str, int]:
    """Register spill bytes (stores + loads) that ptxas reported, per kernel symbol.

    ptxas names a kernel by its mangled CUTLASS type, which does not contain our symbol. A unit
    of one kernel gets every report of its log; in a unit of several, a report that names no
    symbol is charged to every kernel of the unit (a warning worth a look, not an attribution).
    """
    symbols = list(symbols)
    out = {s: 0 for s in symbols}
    current: list[str] = symbols
    for line in log.splitlines():
        if "Compiling entry function" in line or "Function properties for" in line:
            named = [s for s in symbols if s in line]
            current = named or symbols
        found = _SPILL.search(line)
        if found:
            for s in current:
                out[s] += int(found.group(1)) + int(found.group(2))
    return out


_CHILD_SIGNAL = re.compile(r"died due to signal (\d+)")
_DISK_FULL = ("No space left on device", "Disk quota exceeded")
# How compilers name a place in the source: EDG/cudafe++ "file(12): error", gcc "file:12:3: error",
# ptxas and nvlink about the kernel's code.
_DIAGNOSIS = re.compile(
    r"\(\d+\): (?:catastrophic )?error|:\d+:\d+: (?:fatal )?error:|^\s*(?:ptxas|nvlink) (?:error|fatal)", re.MULTILINE
)
# Within a diagnosis: the machine's or the installation's fault (a header gone, memory).
_ENVIRONMENT_IN_DIAGNOSIS = ("cannot open source file", "No such file or directory", "out of memory",
                             "Memory allocation failure", "Cannot allocate memory", "Permission denied")
# Outside one: nvcc's own complaints (host compiler, temporary files, options), a tool not found.
_ENVIRONMENT = ("nvcc fatal", "not found", "No such file or directory", "Permission denied",
                "Read-only file system", "Too many open files", "Cannot allocate memory", "died with status")


def transient_reason(code: int | None, log: str) -> str | None:
    """Why a failed nvcc run says nothing about the kernel, or None when the compiler itself
    rejected the source. Only a diagnosis of the source is the kernel's outcome (cached); a
    process killed by a signal (the kernel's OOM killer sends SIGKILL), a full disk, a missing
    host compiler or temporary folder, or a failure without any diagnosis may succeed in
    another shell or next time, so such failures are never cached."""
    child = _CHILD_SIGNAL.search(log)
    number = -code if code is not None and code < 0 else int(child.group(1)) if child else None
    if number is not None:
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        tool = "nvcc" if code is not None and code < 0 else "a compiler stage under nvcc"
        return f"{tool} was killed by {name}" + (" (out of memory?)" if number == signal.SIGKILL else "")
    for line in log.splitlines():
        if any(marker in line for marker in _DISK_FULL):
            return f"disk full while building: {line.strip()[:200]}"
    for line in log.splitlines():
        markers = _ENVIRONMENT_IN_DIAGNOSIS if _DIAGNOSIS.search(line) else _ENVIRONMENT
        if any(marker in line for marker in markers):
            return f"environment, not the kernel: {line.strip()[:200]}{_host_compiler_hint()}"
    if not _DIAGNOSIS.search(log):
        last = (log.strip().splitlines() or ["no output"])[-1].strip()[:200]
        return f"environment, not the kernel: nvcc failed without diagnosing the source: {last}{_host_compiler_hint()}"
    return None


def _host_compiler_hint() -> str:
    if os.environ.get("NVCC_CCBIN") or shutil.which("g++") or shutil.which("gcc"):
        return ""
    return " (no gcc or g++ on PATH)"


_PR_SET_PDEATHSIG = 1

# Runs nvcc in the process group it leads, and kills that group (nvcc and its stages: cicc,
# cudafe++, ptxas, gcc) when our process dies, SIGKILL included: the kernel sends it SIGTERM then
# (`_die_with_parent`). PR_SET_PDEATHSIG on nvcc alone would leave the running stage behind, as
# the setting is not inherited by children. Standard library only, no site: it starts in ~20 ms.
_SUPERVISOR = """
import os, signal, subprocess, sys
def stop(number, frame):
    os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGTERM, stop)
if os.getppid() != int(sys.argv[1]):
    stop(0, None)
code = subprocess.Popen(sys.argv[2:]).wait()
if code < 0:
    try:
        signal.signal(-code, signal.SIG_DFL)
    except (OSError, ValueError):
        pass
    os.kill(os.getpid(), -code)
    sys.exit(128 - code)
sys.exit(code)
"""


def _die_with_parent() -> None:
    """In the supervisor child before exec: Linux sends it SIGTERM when the thread that started
    it dies (SIGKILL of cutlass-tune included), and it then kills nvcc's whole group."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _first_error(log: str) -> str:
    for line in log.splitlines():
        if "error" in line.lower():
            return line.strip()[:300]
    return (log.strip().splitlines() or ["nvcc failed without output"])[-1][:300]


class _Processes:
    """Running nvcc process groups, so an interrupt can kill them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen] = set()
        self.stopping = False

    def run(self, cmd: list[str], log_path: Path, timeout: float) -> tuple[int | None, str]:
        """Run `cmd` in its own process group (under `_SUPERVISOR` on Linux), its temporary
        files in the log's folder; return (exit code or None on timeout, log)."""
        if sys.platform == "linux":
            cmd = [sys.executable, "-I", "-S", "-c", _SUPERVISOR, str(os.getpid()), *cmd]
        # nvcc's temporary files go to the build folder: a TMPDIR that is missing or full must
        # not fail the build, and a killed build's files go with its folder.
        env = {**os.environ, "TMPDIR": str(log_path.parent)}
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                                    preexec_fn=_die_with_parent if sys.platform == "linux" else None)
            with self._lock:
                if self.stopping:
                    self._kill(proc)
                self._procs.add(proc)
            try:
                code: int | None = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._kill(proc)
                proc.wait()
                code = None
            finally:
                with self._lock:
                    self._procs.discard(proc)
        return code, log_path.read_text(errors="replace")

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def kill_all(self) -> None:
        with self._lock:
            self.stopping = True
            for proc in self._procs:
                self._kill(proc)


@dataclasses.dataclass
class _Build:
    cache: KernelCache
    toolchain: Toolchain
    timeout: float
    processes: _Processes
    keys: dict[str, str]  # config hash -> kernel key

    def unit(self, configs: list[KernelConfig]) -> list[CompiledKernel]:
        """Build one unit (holding its kernels' locks); split it up if it fails."""
        keys = sorted(self.keys[c.hash] for c in configs)
        with contextlib.ExitStack() as locks:
            for key in keys:
                locks.enter_context(self._locked(key))
            cached = {c.hash: self.cache.lookup(self.keys[c.hash], c) for c in configs}
            done = {h: k for h, k in cached.items() if k is not None}
            todo = [c for c in configs if c.hash not in done]
            if todo:
                for r in self._compile(todo):
                    done[r.config.hash] = r
        if len(todo) > 1 and any(done[c.hash].status is not Status.OK for c in todo):
            # One bad kernel fails the whole unit: rebuild each alone to attribute the failure.
            for c in todo:
                done[c.hash] = self.unit([c])[0]
        return [done[c.hash] for c in configs]

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        """Hold `key`'s lock; waiting for another process's build, give up on an interrupt
        (a compile behind a stopped one would otherwise ignore Ctrl-C and SIGTERM for good)."""
        lock = self.cache.lock(key)
        while True:
            if self.processes.stopping:
                raise KeyboardInterrupt
            try:
                lock.acquire(timeout=_LOCK_POLL_S)
                break
            except filelock.Timeout:
                continue
        try:
            yield
        finally:
            lock.release()

    def _compile(self, configs: list[KernelConfig]) -> list[CompiledKernel]:
        if self.processes.stopping:
            raise KeyboardInterrupt
        rendered = render_unit(configs)
        unit_key = hashlib.sha256((self.toolchain.fingerprint + rendered.source).encode()).hexdigest()
        build = self.cache.new_build_dir()
        try:
            source = build / "unit.cu"
            start = time.monotonic()
            try:
                source.write_text(rendered.source)
                code, log = self.processes.run(
                    self.toolchain.command(source, build / "kernels.so"), build / "build.log", self.timeout
                )
            except OSError as err:
                if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                code, log = 1, f"{err.filename}: {err.strerror}"
            seconds = time.monotonic() - start
            if self.processes.stopping:
                raise KeyboardInterrupt
            per_kernel = seconds / len(configs)
            transient = None
            if code is None:
                status, reason = Status.TIMEOUT, f"nvcc exceeded {self.timeout:.0f} s"
            elif code != 0:
                transient = transient_reason(code, log)
                status, reason = Status.COMPILE_ERROR, transient or _first_error(log)
            else:
                # Exit 0 is not enough: a broken or impostor nvcc may leave no or a bogus library,
                # which must not be cached as this kernel's build.
                transient = library_problem(build / "kernels.so")
                if transient:
                    transient = f"nvcc exited 0 but {transient}"
                    status, reason = Status.COMPILE_ERROR, transient
                else:
                    status, reason = Status.OK, ""
            spills = spill_bytes_by_symbol(log, rendered.symbols)
            results = [
                CompiledKernel(
                    config=c, key=self.keys[c.hash], status=status, library=None,
                    symbol=kernel_symbol(c), seconds=per_kernel, cached=False,
                    transient=status is Status.TIMEOUT or transient is not None,
                    reason=reason or (f"ptxas spilled {spills[kernel_symbol(c)]} bytes"
                                      + (f" in a unit of {len(configs)} kernels" if len(configs) > 1 else "")
                                      if spills[kernel_symbol(c)] else ""),
                )
                for c in configs
            ]
            if results[0].transient:
                # Not cached: a timeout may be load, a signal or a full disk the machine's
                # state, not the kernel; keep the evidence aside (nothing, if the disk is full).
                kept = self.cache.root / "tmp" / f"failed-{unit_key[:16]}"
                shutil.rmtree(kept, ignore_errors=True)
                with contextlib.suppress(OSError):
                    os.rename(build, kept)
                return [dataclasses.replace(r, log_path=kept / "build.log", source_path=kept / "unit.cu")
                        for r in results]
            if status is Status.COMPILE_ERROR and len(configs) > 1:
                return results  # the caller splits the unit; cache nothing for the batch
            return self.cache.publish(build, unit_key, results)
        finally:
            shutil.rmtree(build, ignore_errors=True)


def compile_kernels(
    configs: Sequence[KernelConfig],
    *,
    cache: KernelCache | None = None,
    toolchain: Toolchain | None = None,
    jobs: int | None = None,
    timeout: float | None = None,
    kernels_per_unit: int | None = None,
    on_result: ProgressCallback | None = None,
) -> list[CompiledKernel]:
    """Compile every config (cache hits are returned without building), in input order.

    Args:
        configs: distinct configs that pass `check_config`.
        cache: defaults to the cache under `settings.cache_dir()`.
        jobs: parallel nvcc processes; defaults to `default_jobs()`.
        timeout: seconds per nvcc process; defaults to `settings.compile_timeout_s()`.
        kernels_per_unit: kernels per translation unit; None chooses (see `plan_units`).
        on_result: called once per config as its outcome is known (from worker threads).

    Returns:
        One CompiledKernel per config. Compile errors and timeouts are values, not exceptions.

    Raises:
        RenderError: a config is invalid.
        ToolchainError: nvcc or CUTLASS is missing.
        KeyboardInterrupt: re-raised after killing nvcc and removing partial builds.
    """
    for cfg in configs:
        why = check_config(cfg)
        if why:
            raise RenderError(f"{cfg.name} is invalid: {why[0]}")
    toolchain = toolchain or find_toolchain()
    cache = cache or KernelCache.at()
    cache.remove_stale_builds()
    jobs = jobs or default_jobs()
    keys = {c.hash: kernel_key(c, toolchain) for c in configs}
    results: dict[str, CompiledKernel] = {}
    misses = []
    for c in configs:
        hit = cache.lookup(keys[c.hash], c)
        if hit:
            results[c.hash] = hit
            if on_result:
                on_result(hit)
        else:
            misses.append(c)
    build = _Build(cache, toolchain, timeout or settings.compile_timeout_s(), _Processes(), keys)
    units = plan_units(misses, jobs, kernels_per_unit)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(jobs, max(1, len(units))))
    try:
        futures = [pool.submit(build.unit, u) for u in units]
        for future in concurrent.futures.as_completed(futures):
            for r in future.result():
                results[r.config.hash] = r
                if on_result:
                    on_result(r)
    except BaseException:
        build.processes.kill_all()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    return [results[c.hash] for c in configs]
