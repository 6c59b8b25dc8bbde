"""Kernels run in a worker process, one per GPU, that the parent replaces when it is lost.

An illegal address or a failed launch can poison a CUDA context for good, and a kernel can
hang. So jobs go to a child process (multiprocessing, 'spawn': CUDA does not survive fork),
which streams back one `Measurement` per run-time variant:

- a RUNTIME_ERROR measurement means the child saw a CUDA error; it exits right after sending
  it, and the parent starts a fresh child for the variants that remain;
- a child that dies without a word yields RUNTIME_ERROR for the variant it was on;
- no message within `timeout_s` means a hang: the parent kills the child and records TIMEOUT.

Either way the job's remaining variants, and the next jobs, run in a fresh child.

Protocol. Parent to child: a `Job`, or None to stop. Child to parent: ("ready", EnvStamp),
then ("result", Measurement) per variant; ("error", traceback) for a failure of our own code,
which the parent raises as `WorkerError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import signal
import traceback
from collections.abc import Callable, Generator, Iterator
from multiprocessing.connection import Connection
from typing import Any, Protocol

from ..errors import GpuUnusableError
from ..measurement import EnvStamp, Measurement
from ..space import RuntimeArgs
from ..status import Status
from ._job import Job

DEFAULT_TIMEOUT_S = 60.0
"""Seconds one measurement may take (inputs, reference, check, timing) before it is a hang."""
DEFAULT_START_TIMEOUT_S = 180.0
_EXIT_AFTER_CUDA_ERROR = 3
_REAP_S = 30.0


class JobRunner(Protocol):
    """Runs jobs inside the worker. `env` is sent to the parent once it is constructed."""

    @property
    def env(self) -> EnvStamp | None: ...

    def __call__(self, job: Job) -> Iterator[Measurement]: ...


RunnerFactory = Callable[[int], JobRunner]
"""Builds the runner from a device index in the child; must be picklable (module level)."""


class WorkerError(RuntimeError):
    """The worker failed for a reason that is not a kernel's: it could not start, or our own
    code raised (the message holds the child's traceback)."""


class WorkerStartError(WorkerError, GpuUnusableError):
    """The worker could not start, or start again after losing a child: its GPU is unusable
    (CUDA cannot initialize, the context cannot be created) or too slow to come up. A problem
    of the host, not of our code: it reads as one line, and a sweep on several GPUs carries on
    without this one."""


def _default_factory(device: int) -> JobRunner:
    from ._runner import GpuRunner  # imports torch: in the worker's child process only

    return GpuRunner(device)


def _serve(conn: Connection, device: int, factory: RunnerFactory) -> None:
    """Child main loop."""
    # Ctrl-C reaches the whole process group; the parent decides what to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        runner = factory(device)
        conn.send(("ready", getattr(runner, "env", None)))
        while (job := conn.recv()) is not None:
            for measurement in runner(job):
                conn.send(("result", measurement))
                if measurement.status is Status.RUNTIME_ERROR:
                    conn.close()
                    # Skip interpreter teardown: CUDA calls in it can hang on a lost context.
                    os._exit(_EXIT_AFTER_CUDA_ERROR)
    except EOFError:
        return
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(("error", traceback.format_exc()))
        os._exit(1)


class Worker:
    """Parent side of the benchmark worker for one GPU. Not thread-safe.

    Args:
        device: CUDA device index the child uses.
        factory: builds the job runner in the child; default `GpuRunner` (tests pass fakes).
        timeout_s: seconds to wait for each measurement before killing the child.
        start_timeout_s: seconds to wait for a child to start (import torch, init CUDA).
    """

    def __init__(self, device: int = 0, *, factory: RunnerFactory | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, start_timeout_s: float = DEFAULT_START_TIMEOUT_S):
        self.device, self.factory = device, factory or _default_factory
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self.env: EnvStamp | None = None
        self.starts = 0
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self._owed = 0  # results the child still owes for the job being collected

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> EnvStamp | None:
        """Start a child unless one is running (one that died while idle is replaced); return
        its environment stamp.

        Raises:
            WorkerStartError: the child died, failed or timed out while starting.
        """
        if self._process is not None:
            if self._process.is_alive():
                return self.env
            self._discard()  # died between jobs (killed, out of memory): nothing was owed
        ctx = multiprocessing.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe()
        process = ctx.Process(target=_serve, args=(child_conn, self.device, self.factory),
                              name=f"cutlass-tune-bench-gpu{self.device}", daemon=True)
        process.start()
        child_conn.close()  # so that the child's death reads as EOF here
        self._process, self._conn = process, parent_conn
        self.starts += 1
        kind, payload = self._receive(self.start_timeout_s)
        if kind != "ready":
            self._discard()
            if kind == "timeout":
                detail = f"did not start within {self.start_timeout_s:g} s"
            elif kind == "exited":
                detail = f"exited with code {payload} while starting"
            else:  # the child's traceback: its last line names the exception
                lines = [line for line in str(payload).splitlines() if line.strip()]
                detail = f"failed while starting: {lines[-1].strip() if lines else payload}"
            raise WorkerStartError(f"benchmark worker for GPU {self.device} {detail}")
        self.env = payload
        return self.env

    def run(self, job: Job) -> Iterator[Measurement]:
        """Measure `job`, yielding one Measurement per variant in order.

        A CUDA error, a crash or a hang becomes a measurement (RUNTIME_ERROR, TIMEOUT) and a
        fresh child carries on. Stopping the iteration while the child still owes results
        discards it (they must not mix with the next job's); stopping after the last result,
        as a caller that takes only the one measurement of a baseline does, keeps it.

        Raises:
            WorkerStartError: see `start` (a fresh child after a lost one cannot start).
            WorkerError: the child's own code failed.
        """
        pending = job.variants
        try:
            while pending:
                self.start()
                self._owed = len(pending)
                conn = self._child()[1]
                with contextlib.suppress(OSError):  # a child that died just now reads as exited below
                    conn.send(dataclasses.replace(job, variants=pending))
                pending = yield from self._collect(job, pending)
        except BaseException:
            if self._owed:
                self._discard()
            raise

    def _collect(self, job: Job, variants: tuple[RuntimeArgs, ...]
                 ) -> Generator[Measurement, None, tuple[RuntimeArgs, ...]]:
        """Yield the results of `variants`; return those left when the child was lost."""
        for i, variant in enumerate(variants):
            kind, payload = self._receive(self.timeout_s)
            if kind == "result":
                if payload.status is Status.RUNTIME_ERROR:  # the child exits after sending it
                    self._discard(wait=True)
                    yield payload
                    return variants[i + 1:]
                self._owed -= 1
                yield payload
                continue
            self._discard()
            if kind == "error":
                raise WorkerError(f"benchmark worker failed on {job.kernel_name}:\n{payload}")
            if kind == "timeout":
                reason = (f"no result within {self.timeout_s:g} s (a hang, or a kernel far too "
                          "slow): the worker was killed")
                yield job.measurement(variant, Status.TIMEOUT, reason, self.env)
            else:
                reason = f"the worker died (exit code {payload}) while measuring this variant"
                yield job.measurement(variant, Status.RUNTIME_ERROR, reason, self.env)
            return variants[i + 1:]
        return ()

    def _child(self) -> tuple[multiprocessing.process.BaseProcess, Connection]:
        """The child's process and pipe, to hold as local references: `close` from another
        thread (a sweep stopping while this worker's lane still waits on a hung kernel) may
        clear the attributes meanwhile.

        Raises:
            WorkerError: the worker has no child (it was closed).
        """
        process, conn = self._process, self._conn
        if process is None or conn is None:
            raise WorkerError(f"benchmark worker for GPU {self.device} was closed")
        return process, conn

    def _receive(self, timeout: float) -> tuple[str, Any]:
        process, conn = self._child()
        try:
            if not conn.poll(timeout):
                return "timeout", None
            return conn.recv()
        except (EOFError, OSError):
            process.join(_REAP_S)
            return "exited", process.exitcode

    def _discard(self, wait: bool = False) -> None:
        """Forget the child: let it exit (`wait`) or kill it."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if process is None or conn is None:
            return
        if wait:
            process.join(_REAP_S)
        if process.is_alive():
            process.kill()
            process.join(_REAP_S)
        conn.close()

    def close(self) -> None:
        """Stop the child (asking first, killing it if it does not stop)."""
        if self._process is not None and self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.send(None)
            self._process.join(5)
        self._discard()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
