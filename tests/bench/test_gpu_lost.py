"""On a Hopper GPU: a lane whose worker is lost and cannot start again is given up, and the
other lane measures what it left, for real.

Two benchmark workers share the one GPU here (a sweep gives each GPU its own); the second's
child is killed, as a faulting kernel takes it down, and its next start made to fail, as on a
GPU that fell off the bus. Run with `python3 -m pytest tests/bench/test_gpu_lost.py -m gpu -s`.
"""

import os
import signal

import pytest

from cutlass_tune.bench import TimingOptions, WorkerBenchmarker, WorkerStartError
from cutlass_tune.search import LaneEvent, LaneLost, Lanes
from cutlass_tune.space import Problem, RasterOrder, RuntimeArgs
from cutlass_tune.status import Status

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

PROBLEMS = [Problem(m, 4096, 4096) for m in (1024, 2048, 3072, 4096)]
VARIANTS = (RuntimeArgs(), RuntimeArgs(raster=RasterOrder.ALONG_N, swizzle=2))


def gpu_unusable(device):
    raise RuntimeError("CUDA error: unspecified launch failure (planted: the GPU cannot start a worker)")


def rest(task, taken):
    problem, variants = task
    names = {m.runtime.name for m in taken}
    left = tuple(v for v in variants if v.name not in names)
    return (problem, left) if left else None


def test_a_lane_that_cannot_start_a_worker_again_is_given_up_and_the_other_measures_the_rest(
        cooperative_kernel):
    timing = TimingOptions(budget_ms=40, warmup_ms=5, paired=True)
    benches = [WorkerBenchmarker(0, timing=timing), WorkerBenchmarker(0, timing=timing)]
    try:
        lost = benches[1].worker
        lost.factory = gpu_unusable
        os.kill(lost.pid, signal.SIGKILL)
        lost._process.join(10)
        lanes = Lanes(benches, retire_on=(WorkerStartError,))
        events = list(lanes.run([(p, VARIANTS) for p in PROBLEMS],
                                lambda b, t: b.measure(cooperative_kernel, t[0], t[1]), remainder=rest))
    finally:
        for b in benches:
            b.close()
    given_up = [e for e in events if isinstance(e, LaneLost)]
    assert [e.lane for e in given_up] == [0 + 1]
    assert "failed while starting: RuntimeError: CUDA error: unspecified launch failure" in given_up[0].reason
    results = [e for e in events if isinstance(e, LaneEvent) and e.result is not None]
    by_key = {}
    for e in results:
        by_key.setdefault((e.result.problem.name, e.result.runtime.name), []).append(e)
    assert len(by_key) == len(PROBLEMS) * len(VARIANTS)  # every variant of every problem, once
    assert all(len(v) == 1 for v in by_key.values())
    # Lane 1 found its worker dead before its first task, could not start another and handed
    # the task back; lane 0 measured everything.
    assert {e.lane for e in results} == {0}
    for e in results:
        assert e.result.status is Status.OK and e.result.rel_error < 1e-2
        assert 0.5 < e.result.paired_ratio < 1.5
    for e in results:
        print(f"lane {e.lane}: {e.result.problem.name} {e.result.runtime.name} ratio {e.result.paired_ratio:.3f}")
    print(f"given up: lane {given_up[0].lane}: {given_up[0].reason}")
