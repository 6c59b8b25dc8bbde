import dataclasses
from pathlib import Path

import pytest

from cutlass_tune.bench import (
    InvalidJobError,
    Job,
    TimingOptions,
    baseline_ratio,
    plan_jobs,
    repeat_spread,
)
from cutlass_tune.compile import CompiledKernel
from cutlass_tune.errors import CutlassTuneError
from cutlass_tune.measurement import Measurement, TimingMethod
from cutlass_tune.space import DType, KernelConfig, Layout, Problem, RasterOrder, RuntimeArgs, TileScheduler
from cutlass_tune.status import Status

PERSISTENT = KernelConfig()
STREAM_K = KernelConfig(tile_scheduler=TileScheduler.STREAM_K)


def _compiled(cfg, status=Status.OK):
    ok = status is Status.OK
    return CompiledKernel(config=cfg, key=cfg.hash, status=status, library=Path("/k.so") if ok else None,
                          symbol=f"ct_{cfg.hash}", seconds=30.0, cached=False,
                          reason="" if ok else "error: static assertion failed",
                          log_path=Path("/u/build.log"), source_path=Path("/u/unit.cu"))


def test_a_bf16_problem_with_k_not_a_multiple_of_8_is_rejected_with_the_tma_rule():
    with pytest.raises(InvalidJobError, match="TMA needs") as info:
        Job.baseline(Problem(1024, 1024, 1020))
    assert isinstance(info.value, CutlassTuneError)  # the CLI prints it as one line, exit 2
    with pytest.raises(InvalidJobError, match="K=1020"):
        Job.for_kernel(_compiled(PERSISTENT), Problem(1024, 1024, 1020), (RuntimeArgs(),))


def test_kernel_and_problem_must_agree():
    nt = Problem(1024, 1024, 1024, layout_a=Layout.COL, layout_b=Layout.ROW)
    with pytest.raises(InvalidJobError, match="layout_a"):
        Job.for_kernel(_compiled(PERSISTENT), nt, (RuntimeArgs(),))
    with pytest.raises(InvalidJobError, match="Stream-K"):
        Job.for_kernel(_compiled(PERSISTENT), Problem(64, 64, 64), (RuntimeArgs(splits=2),))
    with pytest.raises(InvalidJobError, match="did not compile"):
        Job.for_kernel(_compiled(PERSISTENT, Status.COMPILE_ERROR), Problem(64, 64, 64), (RuntimeArgs(),))
    with pytest.raises(InvalidJobError, match="no run-time variants"):
        Job(problem=Problem(64, 64, 64), variants=(RuntimeArgs(swizzle=2),))


def test_plan_measures_the_baseline_first_in_every_pass():
    problems = [Problem(512, 512, 512), Problem(1024, 1024, 1024),
                Problem(512, 512, 512, dtype_a=DType.F16, dtype_b=DType.F16, dtype_d=DType.F16)]
    kernels = [_compiled(PERSISTENT), _compiled(STREAM_K), _compiled(KernelConfig(tile_n=64), Status.TIMEOUT)]

    def variants(cfg):
        out = [RuntimeArgs(raster=r) for r in (RasterOrder.ALONG_M, RasterOrder.ALONG_N)]
        return out + [RuntimeArgs(splits=2)] if cfg.tile_scheduler is TileScheduler.STREAM_K else out

    plan = plan_jobs(kernels, problems, variants, timing=TimingOptions(method=TimingMethod.GRAPH), repeat=2)
    names = [(j.repeat, j.problem.m, j.problem.dtype_a.value, j.kernel_name) for j in plan.jobs]
    per_pass = [(512, "bf16", "cuBLAS"), (512, "bf16", PERSISTENT.name), (512, "bf16", STREAM_K.name),
                (1024, "bf16", "cuBLAS"), (1024, "bf16", PERSISTENT.name), (1024, "bf16", STREAM_K.name),
                (512, "f16", "cuBLAS")]  # no f16 kernel: only the baseline
    assert names == [(rep, *n) for rep in (0, 1) for n in per_pass]
    assert all(j.timing.method is TimingMethod.GRAPH for j in plan.jobs)
    assert [len(j.variants) for j in plan.jobs[:3]] == [1, 2, 3]
    # The kernel that did not compile: one record per bf16 problem, with the evidence.
    assert [(m.status, m.problem.m) for m in plan.failures] == [(Status.COMPILE_ERROR, 512),
                                                                (Status.COMPILE_ERROR, 1024)]
    assert "/u/build.log" in plan.failures[0].reason
    assert plan.size == 2 + 2 * (1 + 2 + 3 + 1 + 2 + 3 + 1)


def _m(problem, kernel, ms, repeat=0, status=Status.OK, baseline=False):
    return Measurement(problem, None, RuntimeArgs(), status, symbol=kernel, is_baseline=baseline,
                       median_ms=ms if status is Status.OK else None, repeat=repeat)


def test_ratio_to_the_baseline_of_the_same_pass():
    p = Problem(64, 64, 64)
    baselines = {(p, 0): _m(p, "", 2.0, baseline=True), (p, 1): _m(p, "", 1.0, baseline=True)}
    assert baseline_ratio(_m(p, "k", 1.0, repeat=0), baselines) == 2.0
    assert baseline_ratio(_m(p, "k", 1.0, repeat=1), baselines) == 1.0
    assert baseline_ratio(_m(p, "k", 1.0, repeat=2), baselines) is None
    assert baseline_ratio(_m(p, "k", 0, status=Status.TIMEOUT), baselines) is None


def test_repeat_spread_compares_the_same_measurement_across_passes():
    p, q = Problem(64, 64, 64), Problem(128, 128, 128)
    ms = [_m(p, "a", 1.0, 0), _m(p, "a", 1.1, 1), _m(q, "a", 2.0, 0), _m(q, "a", 2.0, 1),
          _m(p, "b", 1.0, 0), _m(p, "b", 0, 1, Status.TIMEOUT), _m(p, "c", 5.0, 0)]
    assert repeat_spread(ms) == pytest.approx([0.1, 0.0])
    assert repeat_spread([dataclasses.replace(ms[0])]) == []
