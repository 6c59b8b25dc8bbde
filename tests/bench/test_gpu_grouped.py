"""On a Hopper GPU: the grouped baselines (torch._grouped_mm, the expert loop, the dense GEMM) on
real operands against the fp32 reference, and the runner's grouped baseline row by every method.

Run with `python3 -m pytest tests/bench/test_gpu_grouped.py -m gpu -s` on the GPU host (`-s`
prints the TFLOP/s of the three torch paths).
"""

import pytest
import torch

from cutlass_tune.bench import GpuRunner, Job, TimingOptions
from cutlass_tune.bench._targets import baseline_target, grouped_mm
from cutlass_tune.bench._verify import allocate, randomize, reference
from cutlass_tune.measurement import Baseline, TimingMethod
from cutlass_tune.space import Layout, Problem, Routing, RuntimeArgs
from cutlass_tune.status import Status

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(grouped_mm() is None, reason=f"torch {torch.__version__} has no grouped GEMM")]

# Qwen3-30B-A3B's gate_up at 4096 routed rows, zipf; a small one with experts of no rows.
QWEN = Problem.experts(128, 1536, 2048, 4096, routing=Routing.ZIPF)
EMPTY = Problem.experts(8, 256, 512, 1000, routing=Routing.HISTOGRAM, group_rows=(600, 0, 0, 300, 100, 0, 0, 0))
SHORT = TimingOptions(budget_ms=30, warmup_ms=5)


@pytest.mark.parametrize("problem", [QWEN, EMPTY, Problem.experts(16, 512, 1024, 2048, layout_b=Layout.ROW)],
                         ids=["qwen-zipf", "empty-experts", "tt"])
@pytest.mark.parametrize("kind", [Baseline.GROUPED_MM, Baseline.EXPERT_LOOP, Baseline.DENSE])
def test_the_grouped_baselines_match_the_fp32_reference(problem, kind):
    ops = allocate(problem, "cuda:0")
    randomize(ops, torch.Generator("cuda:0").manual_seed(0))
    ref = reference(ops)
    target = baseline_target(problem, kind)
    assert target.setup(RuntimeArgs(), ops) is None
    verdict = target.check(ops, ref)
    assert verdict.status is Status.OK and verdict.rel_error < 1e-2, verdict.reason
    target.close()


@pytest.mark.parametrize("method", list(TimingMethod))
def test_the_grouped_baseline_row_carries_the_loop_and_dense_by_every_method(method):
    runner = GpuRunner(0)
    [m] = runner(Job.baseline(QWEN, timing=TimingOptions(budget_ms=30, warmup_ms=5, method=method)))
    assert m.status is Status.OK and m.reason == "" and m.kernel_name == "torch._grouped_mm", m.reason
    assert m.loop_median_ms and m.dense_median_ms and m.method == method.value
    print(f"\n{QWEN.name} ({method.value}): torch._grouped_mm {m.tflops:.0f} TFLOP/s, loop "
          f"{m.side_tflops(Baseline.EXPERT_LOOP):.0f}, dense {m.side_tflops(Baseline.DENSE):.0f}")
