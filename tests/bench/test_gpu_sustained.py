"""On a Hopper GPU: the sustained timing method and the call-site check.

Run with `python3 -m pytest tests/bench/test_gpu_sustained.py -m gpu -s` on the GPU host.
"""

import json

import pandas as pd
import pytest
import torch

from cutlass_tune.bench import ClockMonitor, GpuRunner, Job, TimingOptions, check_table
from cutlass_tune.bench._timing import rotation_count, time_sustained
from cutlass_tune.measurement import TimingMethod
from cutlass_tune.runtime import BestTable
from cutlass_tune.space import Problem, RuntimeArgs
from cutlass_tune.status import Status

pytestmark = [pytest.mark.gpu]

SUSTAINED = TimingOptions(budget_ms=500, min_samples=4, method=TimingMethod.SUSTAINED, paired=True)


def _matmuls(problem, copies):
    ops = [(torch.randn(problem.m, problem.k, device="cuda", dtype=torch.bfloat16),
            torch.randn(problem.n, problem.k, device="cuda", dtype=torch.bfloat16).t()) for _ in range(copies)]
    return [lambda a=a, b=b: torch.matmul(a, b) for a, b in ops]


def test_sustained_timing_reports_time_energy_and_clock_per_launch():
    problem = Problem(4096, 4096, 4096)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copies = rotation_count(3 * 4096 * 4096 * 2, l2)
    monitor = ClockMonitor(0)
    stats, = time_sustained([_matmuls(problem, copies)], options=SUSTAINED, probe=monitor.reading)
    nvml = monitor.read()  # NVML's own power figure, averaged over the last second or so
    tflops = problem.flops / (stats.median_ms * 1e9)
    print(f"\n4096^3 torch.matmul sustained over {copies} copies: {stats.median_ms:.4f} ms "
          f"({tflops:.0f} TFLOP/s, spread {stats.spread:.1%}), {stats.energy_mj} mJ, {stats.sm_mhz} MHz, "
          f"{stats.power_w} W")
    assert stats.samples >= 4 and 100 < tflops < 1000
    if stats.energy_mj is not None:  # NVML present: the power read from its energy counter is its power
        print(f"NVML power usage right after: {nvml.power_w} W")
        assert stats.power_w is not None and 100 < stats.power_w < 1200
        assert nvml.power_w == pytest.approx(stats.power_w, rel=0.25)


@pytest.mark.nvcc
def test_the_runner_times_a_kernel_and_its_baseline_sustained(gpu_kernels):
    runner = GpuRunner(0)
    job = Job.for_kernel(gpu_kernels["cooperative"], Problem(4096, 4096, 4096), (RuntimeArgs(),), timing=SUSTAINED)
    m, = runner(job)
    print(f"\n{m.kernel_name} sustained: {m.median_ms:.4f} ms, ratio {m.paired_ratio:.3f}, "
          f"{m.energy_mj} mJ (cuBLAS {m.baseline_energy_mj} mJ), {m.sm_mhz} MHz")
    assert m.status is Status.OK and m.method == "sustained"
    assert m.paired_ratio is not None and 0.5 < m.paired_ratio < 2


@pytest.mark.nvcc
def test_check_calls_matmul_and_torch_for_every_entry(gpu_kernels):
    k = gpu_kernels["cooperative"]
    problem = Problem(2048, 2048, 2048)
    row = dict(gpu="any", problem=problem.name, m=2048, n=2048, k=2048, dtype_a="bf16", dtype_b="bf16",
               dtype_d="bf16", layout="tn", kernel=k.config.name, config=json.dumps(k.config.to_dict()),
               raster="along_n", swizzle=1, splits=1, decomposition="heuristic", ratio=1.0)
    table = BestTable(pd.DataFrame([row]))
    found, = check_table(table, options=TimingOptions(budget_ms=300, min_samples=3))
    print("\n" + str(found.to_dict()))
    assert not found.error and [d.mode for d in found.delivered] == ["loop", "graph"]
    assert all(0.5 < d.ratio < 2 for d in found.delivered)


@pytest.mark.nvcc
def test_check_calls_a_fused_entry_with_its_operands_against_every_torch_path():
    # Guards check on fused tables: the entry is called with its bias and activation (a plain
    # call would find no kernel and read "wrong"), and timed against eager, torch.compile and
    # cuBLASLt's own epilogue, the strongest of which it reports.
    from cutlass_tune.space import Activation, Epilogue, KernelConfig

    epilogue = Epilogue(bias=True, activation=Activation.GELU_TANH)
    config = KernelConfig(epilogue=epilogue)
    problem = Problem(2048, 4096, 1024, epilogue=epilogue)
    row = dict(gpu="any", problem=problem.name, m=2048, n=4096, k=1024, dtype_a="bf16", dtype_b="bf16",
               dtype_d="bf16", layout="tn", kernel=config.name, config_hash=config.hash,
               config=json.dumps(config.to_dict(), sort_keys=True), raster="along_n", swizzle=1, splits=1,
               decomposition="heuristic", epilogue=epilogue.name, scaling="none", ratio=1.0)
    found, = check_table(BestTable(pd.DataFrame([row])), options=TimingOptions(budget_ms=300, min_samples=3))
    print("\n" + json.dumps(found.to_dict()["delivered"].get("graph", {}).get("strongest_ratio")))
    assert not found.error, found.error
    for delivered in found.delivered:
        assert set(delivered.others) == {"torch.compile", "cuBLASLt epilogue"}
        assert 0.3 < delivered.strongest_ratio <= delivered.ratio * 1.001
