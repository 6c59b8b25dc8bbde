"""On a host with two or more Hopper GPUs of one model: a sweep's kernels measured on all at once.

Run with `python3 -m pytest tests/bench/test_gpu_lanes.py -m gpu` on such a host.
"""

import pytest
import torch

from cutlass_tune.bench import TimingOptions, WorkerBenchmarker
from cutlass_tune.search import Lanes, require_one_model
from cutlass_tune.space import Problem, RuntimeArgs
from cutlass_tune.status import Status

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs of one model")]

PROBLEMS = [Problem(m, 4096, 4096) for m in (1024, 2048, 3072, 4096, 5120, 6144)]


def test_two_gpus_each_measure_a_share_next_to_their_own_cublas(cooperative_kernel):
    benches = [WorkerBenchmarker(d, timing=TimingOptions(budget_ms=40, warmup_ms=5, paired=True)) for d in (0, 1)]
    try:
        require_one_model(benches)
        events = list(Lanes(benches).run(
            PROBLEMS, lambda b, p: b.measure(cooperative_kernel, p, [RuntimeArgs()])))
    finally:
        for b in benches:
            b.close()
    results = [e for e in events if e.result is not None]
    assert sorted(e.task.m for e in results) == [p.m for p in PROBLEMS]
    by_lane = {lane: [e.result for e in results if e.lane == lane] for lane in (0, 1)}
    assert by_lane[0] and by_lane[1], "one GPU measured everything"
    for lane, ms in by_lane.items():
        for m in ms:
            assert m.status is Status.OK and m.rel_error < 1e-2
            assert m.env.device == lane and m.env.gpu_uuid  # stamped with the GPU that measured it
            assert m.paired_ratio is not None and 0.5 < m.paired_ratio < 1.5
    assert by_lane[0][0].env.gpu_uuid != by_lane[1][0].env.gpu_uuid
    for e in results:
        print(f"GPU {e.lane} {e.result.env.gpu_uuid}: {e.task.name} ratio {e.result.paired_ratio:.3f}")
