"""On a Hopper GPU: each timing regime on a real kernel, and the clocks it runs at.

Run with `python3 -m pytest tests/bench/test_gpu_regimes.py -m gpu -s` on the GPU host.
"""

import math

import pytest
import torch

from cutlass_tune.bench import ClockMonitor, TimingOptions, time_regime
from cutlass_tune.bench._timing import rotation_count
from cutlass_tune.measurement import TimingMethod
from cutlass_tune.regime import RegimeSpec

pytestmark = [pytest.mark.gpu]

OPTIONS = TimingOptions(budget_ms=600, min_samples=4, method=TimingMethod.SUSTAINED)
REGIMES = ("sustained", "idle-gap:200us", "interleaved:64MiB", "as-captured:0.7:150us")


def _sides(size):
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copies = rotation_count(3 * size * size * 2, l2)
    ops = [(torch.randn(size, size, device="cuda", dtype=torch.bfloat16),
            torch.randn(size, size, device="cuda", dtype=torch.bfloat16).t()) for _ in range(copies)]
    plain = [lambda a=a, b=b: torch.matmul(a, b) for a, b in ops]
    # the other side: the same GEMM through F.linear (another path to a cuBLAS kernel)
    linear = [lambda a=a, b=b: torch.nn.functional.linear(a, b.t()) for a, b in ops]
    return [plain, linear]


@pytest.mark.parametrize("size", [4096, 2048])
@pytest.mark.parametrize("regime", REGIMES)
def test_each_regime_gives_a_finite_ratio_and_records_clocks(regime, size):
    """At 2048^3 (28 us a call) as at 4096^3: `check --regime idle-gap:200us` once read torch's
    2048^3 GEMM at 341 us a call; `time_regime` now raises where a side reads more than 2x its
    back-to-back time, so this fails with both figures if cuBLAS's kernel of that size is the cause."""
    spec = RegimeSpec.parse(regime)
    first, second = time_regime(_sides(size), spec, options=OPTIONS, probe=ClockMonitor(0).reading)
    ratio = first.median_ms / second.median_ms
    print(f"\n{size}^3 {regime}: {first.median_ms:.4f} / {second.median_ms:.4f} ms, ratio {ratio:.3f}, "
          f"{first.sm_mhz} MHz, {first.power_w} W, spread {first.spread:.1%}, dropped {first.dropped}/{second.dropped}")
    assert math.isfinite(ratio) and 0.8 < ratio < 1.25  # one cuBLAS GEMM both ways
    assert first.sm_mhz is not None and first.sm_mhz > 0
    assert first.samples >= OPTIONS.min_samples


def test_idle_gaps_read_a_higher_clock_than_back_to_back():
    """A compute-bound GEMM back to back runs at the power cap; with idle gaps the clock rises."""
    probe = ClockMonitor(0).reading
    sides = _sides(8192)[:1]
    back_to_back, = time_regime(sides, RegimeSpec.parse("sustained"), options=OPTIONS, probe=probe)
    gapped, = time_regime(sides, RegimeSpec.parse("idle-gap:2000us"), options=OPTIONS, probe=probe)
    print(f"\n8192^3: sustained {back_to_back.sm_mhz} MHz {back_to_back.power_w} W {back_to_back.median_ms:.3f} ms; "
          f"idle-gap {gapped.sm_mhz} MHz {gapped.power_w} W {gapped.median_ms:.3f} ms")
    assert gapped.sm_mhz > back_to_back.sm_mhz
    assert gapped.median_ms < back_to_back.median_ms


@pytest.mark.parametrize("regime", REGIMES[1:])
def test_check_measures_an_entry_in_a_regime_with_its_clock(gpu_kernels, regime):
    import json

    import pandas as pd

    from cutlass_tune.bench import check_table
    from cutlass_tune.runtime import BestTable
    from cutlass_tune.space import Problem

    k = gpu_kernels["cooperative"]
    problem = Problem(2048, 2048, 2048)
    row = dict(gpu="any", problem=problem.name, m=2048, n=2048, k=2048, dtype_a="bf16", dtype_b="bf16",
               dtype_d="bf16", layout="tn", kernel=k.config.name, config=json.dumps(k.config.to_dict()),
               raster="along_n", swizzle=1, splits=1, decomposition="heuristic", ratio=1.0)
    found, = check_table(BestTable(pd.DataFrame([row])), options=TimingOptions(budget_ms=300, min_samples=3),
                         regime=RegimeSpec.parse(regime))
    print("\n" + str(found.to_dict()))
    for d in found.delivered:
        print(f"{regime}: matmul {d.tuned.median_ms * 1000:.1f} us (dropped {d.tuned.dropped}), torch "
              f"{d.torch.median_ms * 1000:.1f} us (dropped {d.torch.dropped})")
    assert not found.error and [d.mode for d in found.delivered] == [regime] and found.regime == regime
    assert 0.5 < found.call_site_ratio < 2 and found.delivered[0].tuned.sm_mhz > 0


@pytest.mark.parametrize("regime", REGIMES)
def test_the_runner_times_a_cutlass_kernel_and_its_baseline_in_each_regime(gpu_kernels, regime):
    from cutlass_tune.bench import GpuRunner, Job, regime_options
    from cutlass_tune.space import Problem, RuntimeArgs
    from cutlass_tune.status import Status

    timing = regime_options(TimingOptions(budget_ms=400, min_samples=4, paired=True), RegimeSpec.parse(regime))
    job = Job.for_kernel(gpu_kernels["cooperative"], Problem(4096, 4096, 4096), (RuntimeArgs(),), timing=timing)
    m, = GpuRunner(0)(job)
    print(f"\n{regime}: ratio {m.paired_ratio:.3f}, {m.sm_mhz} MHz {m.power_w} W (cuBLAS {m.baseline_sm_mhz} MHz "
          f"{m.baseline_power_w} W)")
    assert m.status is Status.OK and m.method == "sustained" and m.regime == regime
    assert m.paired_ratio is not None and math.isfinite(m.paired_ratio) and 0.5 < m.paired_ratio < 2
    assert m.sm_mhz > 0 and m.baseline_sm_mhz > 0


def test_the_expert_loop_of_the_grouped_decode_problem_is_timed_interleaved():
    """The torch side of 2048x3072x4096 over 128 experts failed twice in `interleaved:64MiB`
    (runtime_error): torch's expert loop (128 launches of 16 rows) is slower to enqueue than to run,
    so the host never got ahead and every call was dropped; a spin after a drop now lets it."""
    from cutlass_tune.bench import GpuRunner, Job, regime_options
    from cutlass_tune.space import Problem
    from cutlass_tune.status import Status

    timing = regime_options(TimingOptions(budget_ms=400, min_samples=4, paired=True),
                            RegimeSpec.parse("interleaved:64MiB"))
    m, = GpuRunner(0)(Job.baseline(Problem.experts(128, 3072, 4096, 2048), timing=timing))
    print(f"\ndecode baseline interleaved: {m.status.value} {m.reason!r} torch._grouped_mm {m.median_ms} ms, "
          f"loop {m.loop_median_ms} ms, dense {m.dense_median_ms} ms")
    assert m.status is Status.OK, m.reason
    assert m.loop_median_ms is not None and m.loop_median_ms > 0
