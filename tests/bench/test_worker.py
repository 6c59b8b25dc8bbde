"""Worker isolation without a GPU: fake runners crash, hang, fail and misbehave in the child.

Slow: each test starts its worker processes (spawned: a fresh interpreter that imports torch, a
few seconds each), and the hang tests wait out their timeouts; the processes are what is tested."""

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from cutlass_tune.bench import Job, Worker, WorkerError, WorkerStartError, run_plan
from cutlass_tune.bench._session import Plan, require_gpu
from cutlass_tune.errors import CutlassTuneError
from cutlass_tune.measurement import EnvStamp, Measurement
from cutlass_tune.space import KernelConfig, Problem, RuntimeArgs
from cutlass_tune.status import Status

ENV = EnvStamp(host="fake", gpu="Fake GPU", capability="9.0", sm_count=132, l2_bytes=1 << 20,
               driver=None, cuda_runtime=None, torch="0", nvcc=None, cutlass=None)
VARIANTS = tuple(RuntimeArgs(swizzle=s) for s in (1, 2, 4))


class FakeRunner:
    """Job runner whose behaviour on the variant with swizzle 2 is named by the job's symbol."""

    env = ENV

    def __init__(self, device):
        self.device = device

    def __call__(self, job):
        for v in job.variants:
            if v.swizzle == 2:
                if job.symbol == "cuda_error":
                    yield job.measurement(v, Status.RUNTIME_ERROR, "AcceleratorError: illegal address")
                    continue  # a real runner's worker exits after this; the loop must not get here
                if job.symbol == "crash":
                    os._exit(1)
                if job.symbol == "hang":
                    time.sleep(3600)
                if job.symbol == "bug":
                    raise ValueError("bug in our own code")
            yield job.measurement(v, Status.OK, f"pid {os.getpid()}", self.env, median_ms=1.0)


def failing_factory(device):
    raise RuntimeError("CUDA driver initialization failed")


def _job(symbol, variants=VARIANTS):
    return Job(problem=Problem(256, 256, 256), variants=variants, library=Path("/fake.so"), symbol=symbol)


def _pid(m):
    return int(m.reason.split()[1])


@pytest.fixture
def worker():
    with Worker(0, factory=FakeRunner, timeout_s=3, start_timeout_s=60) as w:
        yield w


def test_measurements_stream_in_order_from_one_process(worker):
    first = list(worker.run(_job("ok")))
    second = list(worker.run(_job("ok")))
    assert [m.runtime for m in first] == list(VARIANTS) and [m.status for m in first] == [Status.OK] * 3
    assert {_pid(m) for m in first + second} == {worker.pid} and worker.starts == 1
    assert worker.env == ENV


def test_a_cuda_error_replaces_the_worker_for_the_rest_of_the_job(worker):
    results = list(worker.run(_job("cuda_error")))
    assert [m.status for m in results] == [Status.OK, Status.RUNTIME_ERROR, Status.OK]
    assert "illegal address" in results[1].reason
    assert _pid(results[2]) != _pid(results[0]) and worker.starts == 2
    assert _pid(list(worker.run(_job("ok")))[0]) == _pid(results[2])


def test_a_crash_is_a_runtime_error_and_the_next_variant_runs(worker):
    results = list(worker.run(_job("crash")))
    assert [m.status for m in results] == [Status.OK, Status.RUNTIME_ERROR, Status.OK]
    assert "exit code 1" in results[1].reason and results[1].runtime == VARIANTS[1]
    assert results[1].env == ENV and worker.starts == 2


def test_a_hang_is_killed_and_recorded_as_timeout(worker):
    start = time.monotonic()
    results = list(worker.run(_job("hang")))
    assert [m.status for m in results] == [Status.OK, Status.TIMEOUT, Status.OK]
    assert "3 s" in results[1].reason and results[1].symbol == "hang"
    with pytest.raises(ProcessLookupError):
        os.kill(_pid(results[0]), 0)  # the hung child is gone
    assert time.monotonic() - start < 60


def test_a_bug_in_our_code_raises_with_the_child_traceback(worker):
    with pytest.raises(WorkerError, match="ValueError: bug in our own code"):
        list(worker.run(_job("bug")))
    assert worker.pid is None
    assert [m.status for m in worker.run(_job("ok"))] == [Status.OK] * 3


def test_stopping_early_discards_the_worker_so_results_cannot_mix(worker):
    results = worker.run(_job("ok"))
    next(results)
    results.close()
    assert worker.pid is None
    again = list(worker.run(_job("ok", variants=VARIANTS[2:])))
    assert [m.runtime for m in again] == [VARIANTS[2]]


def test_stopping_after_the_last_result_keeps_the_worker(worker):
    # What a baseline does: take the one measurement of a one-variant job and stop. Nothing is
    # owed, so the child stays (starting one costs seconds: torch and CUDA in a new process).
    first = next(iter(worker.run(_job("ok", VARIANTS[:1]))))
    results = worker.run(_job("ok", VARIANTS[:2]))
    next(results), next(results)
    results.close()  # suspended at its last yield: nothing owed
    again = list(worker.run(_job("ok")))
    assert {_pid(m) for m in [first, *again]} == {worker.pid} and worker.starts == 1


def test_stopping_after_a_cuda_error_as_the_last_result_still_replaces_the_worker(worker):
    results = worker.run(_job("cuda_error", VARIANTS[1:2]))
    assert next(results).status is Status.RUNTIME_ERROR
    results.close()
    assert [m.status for m in worker.run(_job("ok"))] == [Status.OK] * 3 and worker.starts == 2


def once_factory(device):
    """Starts one child; every later one fails as a GPU that fell off the bus would."""
    marker = Path(os.environ["CUTLASS_TUNE_TEST_STARTED"])
    if marker.exists():
        raise RuntimeError("CUDA error: unknown error")
    marker.touch()
    return FakeRunner(device)


def test_a_child_that_died_between_jobs_is_replaced_without_losing_a_variant(worker):
    first = list(worker.run(_job("ok")))
    os.kill(worker.pid, signal.SIGKILL)
    time.sleep(0.5)
    again = list(worker.run(_job("ok")))
    assert [m.status for m in again] == [Status.OK] * 3 and worker.starts == 2
    assert _pid(again[0]) != _pid(first[0])


def test_a_worker_that_cannot_start_says_why_in_one_line():
    with Worker(0, factory=failing_factory, start_timeout_s=60) as w:
        with pytest.raises(WorkerStartError) as caught:
            w.start()
    assert str(caught.value) == ("benchmark worker for GPU 0 failed while starting: "
                                 "RuntimeError: CUDA driver initialization failed")
    assert isinstance(caught.value, CutlassTuneError)  # the CLI prints it as one line


def hanging_factory(device):
    time.sleep(3600)  # CUDA initialization stuck on a wedged GPU


def exiting_factory(device):
    """Writes its pid where CUTLASS_TUNE_TEST_STARTED says, then dies as a crash in the driver would."""
    Path(os.environ["CUTLASS_TUNE_TEST_STARTED"]).write_text(str(os.getpid()))
    os._exit(3)


def test_a_worker_that_never_becomes_ready_is_killed_and_says_so_in_one_line():
    # Guards against a child stuck starting being left to hold its GPU after the parent gives up.
    with Worker(5, factory=hanging_factory, start_timeout_s=1) as w:
        with pytest.raises(WorkerStartError) as caught:
            w.start()
        assert str(caught.value) == "benchmark worker for GPU 5 did not start within 1 s"
        assert w.pid is None
        assert [p for p in multiprocessing.active_children() if p.name == "cutlass-tune-bench-gpu5"] == []


def test_a_worker_that_exits_while_starting_gives_its_exit_code_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTLASS_TUNE_TEST_STARTED", str(tmp_path / "pid"))
    with Worker(0, factory=exiting_factory, start_timeout_s=60) as w:
        with pytest.raises(WorkerStartError) as caught:
            w.start()
        assert str(caught.value) == "benchmark worker for GPU 0 exited with code 3 while starting"
        assert w.pid is None
        with pytest.raises(ProcessLookupError):  # reaped: not even a zombie is left
            os.kill(int((tmp_path / "pid").read_text()), 0)


@pytest.mark.parametrize("device", [2, -1])
def test_a_gpu_index_out_of_range_is_refused_in_one_line(monkeypatch, device):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(CutlassTuneError) as caught:
        require_gpu(device)
    assert str(caught.value) == f"GPU {device} is not visible: there are 2 (0 to 1)"
    require_gpu(1)  # the last visible one passes


def test_a_child_lost_and_not_restarted_ends_the_job_with_a_start_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTLASS_TUNE_TEST_STARTED", str(tmp_path / "started"))
    with Worker(0, factory=once_factory, timeout_s=3, start_timeout_s=60) as w:
        results = w.run(_job("crash"))
        first, lost = next(results), next(results)
        assert first.status is Status.OK and lost.status is Status.RUNTIME_ERROR
        with pytest.raises(WorkerStartError, match="GPU 0 failed while starting: RuntimeError: CUDA error"):
            next(results)  # the third variant needs a fresh child
        assert w.starts == 2 and w.pid is None


def test_run_plan_stamps_compile_failures_with_the_worker_environment():
    p = Problem(256, 256, 256)
    failure = Measurement(p, KernelConfig(), RuntimeArgs(), Status.COMPILE_ERROR, "nvcc failed")
    plan = Plan(jobs=(_job("ok", VARIANTS[:1]),), failures=(failure,))
    results = list(run_plan(plan, factory=FakeRunner, timeout_s=10))
    assert [m.status for m in results] == [Status.COMPILE_ERROR, Status.OK]
    assert all(m.env == ENV for m in results)


def test_closing_from_another_thread_ends_a_wait_on_a_hang_as_a_runtime_error():
    # Regression: a sweep's lane thread waiting on a hung kernel raised AttributeError once the
    # sweep, stopping, closed the worker from its own thread.
    import threading

    worker = Worker(0, factory=FakeRunner, timeout_s=60, start_timeout_s=60)
    worker.start()
    got, errors = [], []

    def wait():
        try:
            got.extend(worker.run(_job("hang", (RuntimeArgs(swizzle=2),))))
        except BaseException as exc:
            errors.append(exc)

    lane = threading.Thread(target=wait)
    lane.start()
    time.sleep(1.0)  # the lane now waits on the hung variant
    worker.close()
    lane.join(30)
    assert not lane.is_alive() and errors == []
    assert [m.status for m in got] == [Status.RUNTIME_ERROR]
