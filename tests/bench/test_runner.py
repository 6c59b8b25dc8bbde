"""The measuring sequence of GpuRunner, run on the CPU with the GPU parts replaced."""

import pytest
import torch

from cutlass_tune.bench import Job, TimingOptions, TimingStats, _runner, _timing
from cutlass_tune.bench._runner import CublasTarget, GpuRunner, _Target
from cutlass_tune.bench._verify import allocate
from cutlass_tune.measurement import TimingMethod
from cutlass_tune.space import DType, KernelConfig, Problem, RuntimeArgs
from cutlass_tune.status import Status

P = Problem(64, 48, 32)


class FakeEvent:
    """A CUDA event on a clock that launches advance by 1 ms each."""

    clock = 0.0

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        self.t = FakeEvent.clock

    def synchronize(self):
        pass

    def query(self):
        return False  # the GPU never catches up with the host here

    def elapsed_time(self, end):
        return end.t - self.t


@pytest.fixture
def fake_cuda(monkeypatch):
    FakeEvent.clock = 0.0
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)


def test_events_sample_each_launch_after_flush_and_prepare(fake_cuda):
    calls = []

    def launch():
        calls.append("launch")
        FakeEvent.clock += 1.0

    stats = _timing.time_launches(launch, options=TimingOptions(budget_ms=20, warmup_ms=3),
                                  flush=lambda: calls.append("flush"), prepare=lambda: calls.append("prepare"))
    assert (stats.median_ms, stats.p20_ms, stats.p80_ms, stats.samples) == (1.0, 1.0, 1.0, 20)
    launches = calls.count("launch")
    assert launches == 1 + _timing.ESTIMATE_LAUNCHES + 3 + 20  # first, estimate, warm-up, samples
    assert calls.count("prepare") == launches  # a Stream-K workspace is re-armed before every launch
    assert calls.count("flush") == 20
    assert calls[-3:] == ["flush", "prepare", "launch"]


def _clocked(log, name, ms):
    """A launch that logs `name` and advances the fake event clock by `ms`."""
    def launch():
        log.append(name)
        FakeEvent.clock += ms
    return launch


def test_paired_sampling_alternates_kernel_and_baseline_by_one_method(fake_cuda):
    calls = []
    options = TimingOptions(budget_ms=40, warmup_ms=3, paired=True)
    kernel, base = _timing.time_paired(_clocked(calls, "kernel", 1.0), _clocked(calls, "cublas", 3.0), options=options,
                                       flush=lambda: calls.append("flush"), prepare=lambda: calls.append("prepare"))
    assert (kernel.median_ms, base.median_ms) == (1.0, 3.0)
    assert kernel.samples == base.samples == 10  # the 40 ms budget covers both: 4 ms a pair
    sampled = [c for c in calls[-40:] if c != "prepare"]
    # each timed launch after its own flush; the kernel goes first in even samples only
    assert sampled[:8] == ["flush", "kernel", "flush", "cublas", "flush", "cublas", "flush", "kernel"]
    assert calls.count("prepare") == calls.count("kernel")  # the re-arm belongs to the kernel alone
    assert calls.count("cublas") == 1 + _timing.ESTIMATE_LAUNCHES + 1 + 10  # first, estimate, warm-up, samples


def test_paired_graph_replays_alternate_and_report_per_launch_times(fake_cuda, monkeypatch):
    class FakeGraph:
        def __init__(self, once, reps):
            self.once, self.reps = once, reps

        def replay(self):
            for _ in range(self.reps):
                self.once()

        def reset(self):
            pass

    monkeypatch.setattr(_timing, "_capture", FakeGraph)
    order = []
    options = TimingOptions(budget_ms=20, warmup_ms=0, method=TimingMethod.GRAPH, paired=True)
    kernel, base = _timing.time_paired(_clocked(order, "k", 0.25), _clocked(order, "b", 0.5), options=options)
    assert (kernel.median_ms, base.median_ms) == (0.25, 0.5)  # a replay of 4 (2) launches / reps
    assert kernel.samples == base.samples == 10
    # samples 8 (kernel first) and 9 (baseline first): 4 kernel launches per replay, 2 cuBLAS
    assert order[-12:] == ["k"] * 4 + ["b"] * 2 + ["b"] * 2 + ["k"] * 4


class CpuTarget(_Target):
    """Computes D on the CPU; misbehaves as told."""

    def __init__(self, mode="ok"):
        self.mode, self.launches, self.rearms = mode, 0, 0
        self.rearm = self._rearm

    def _rearm(self):
        self.rearms += 1

    def setup(self, variant, ops):
        self.ops = ops
        return "can_implement returned kInvalid" if self.mode == "cannot" else None

    def launch(self):
        self.launches += 1
        if self.mode == "fault":
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore detail")
        d = self.ops.a_mk.float() @ self.ops.b_kn.float()
        if self.mode == "stale" and self.launches > 1:
            d += 1  # right once, wrong when repeated (a workspace that is not re-armed)
        self.ops.d.copy_(d)

    def close(self):
        pass


def _fake_time_sides(launches, *, options, flush, prepare):
    """Three rounds of every launch; the target at 2.0 ms, each side 0.5 ms slower than the last."""
    for _ in range(3):
        if prepare is not None:
            prepare()
        for launch in launches:
            launch()
    return [TimingStats(median_ms=2.0 + 0.5 * i, p20_ms=1.9 + 0.5 * i, p80_ms=2.2 + 0.4 * i, samples=3)
            for i in range(len(launches))]


@pytest.fixture
def runner(monkeypatch):
    monkeypatch.setattr(_runner, "time_sides", _fake_time_sides)
    r = GpuRunner.__new__(GpuRunner)  # no CUDA: set by hand what __init__ would
    r.env, r._flush, r._ops = None, None, allocate(P, "cpu")
    r._clocks = type("NoClocks", (), {"read": lambda self: None})()
    return r


def _measure(runner, target, job=None):
    job = job or Job(problem=P, variants=(RuntimeArgs(),), library="/x.so", symbol="ct_x")
    return runner._measure(job, target, job.variants[0], torch.Generator().manual_seed(0))


def test_a_correct_kernel_is_verified_then_timed_then_verified_again(runner):
    target = CpuTarget()
    m = _measure(runner, target)
    assert m.status is Status.OK and m.rel_error < 1e-2
    assert (m.median_ms, m.p20_ms, m.p80_ms, m.samples) == (2.0, 1.9, 2.2, 3)
    assert m.tflops == pytest.approx(P.flops / 2e9) and m.method == "events"
    assert target.launches == 1 + 3 + 1 and target.rearms == target.launches


def test_a_paired_kernel_carries_its_own_cublas_figures(runner):
    target = CpuTarget()
    job = Job(problem=P, variants=(RuntimeArgs(),), library="/x.so", symbol="ct_x",
              timing=TimingOptions(paired=True))
    m = _measure(runner, target, job)
    assert m.status is Status.OK and m.median_ms == 2.0
    assert (m.baseline_median_ms, m.baseline_p20_ms, m.baseline_p80_ms) == (2.5, 2.4, 2.6)
    assert m.paired_ratio == pytest.approx(1.25) and m.baseline_tflops == pytest.approx(P.flops / 2.5e9)
    assert target.launches == 1 + 3 + 1  # the baseline is cuBLAS, not the kernel again


def test_without_a_cublas_path_a_paired_job_is_timed_alone(runner):
    p = Problem(64, 48, 32, dtype_d=DType.F16)  # bf16 x bf16 -> f16: torch.matmul has none
    runner._ops = allocate(p, "cpu")
    job = Job(problem=p, variants=(RuntimeArgs(),), library="/x.so", symbol="ct_x",
              timing=TimingOptions(paired=True))
    m = _measure(runner, CpuTarget(), job)
    assert m.status is Status.OK and m.baseline_median_ms is None and m.paired_ratio is None


@pytest.mark.parametrize("noisy_times,status", [(1, Status.OK), (2, Status.UNSTABLE)])
def test_a_scattered_timing_is_taken_again_and_never_ranks_if_it_stays_so(runner, monkeypatch, noisy_times, status):
    # Regression: a host too busy to keep ahead of the GPU gave a 128^3 kernel a 1.49 "ratio".
    calls = []

    def timing(launches, *, options, flush, prepare):
        calls.append(1)
        launches[0]()
        noisy = len(calls) <= noisy_times
        kernel = TimingStats(median_ms=2.0, p20_ms=1.9, p80_ms=4.0 if noisy else 2.1, samples=3)
        return [kernel, TimingStats(median_ms=2.5, p20_ms=2.4, p80_ms=2.6, samples=3)]

    monkeypatch.setattr(_runner, "time_sides", timing)
    job = Job(problem=P, variants=(RuntimeArgs(),), library="/x.so", symbol="ct_x", timing=TimingOptions(paired=True))
    m = _measure(runner, CpuTarget(), job)
    assert len(calls) == 2 and m.status is status
    assert m.paired_ratio == (None if status is Status.UNSTABLE else pytest.approx(1.25))
    if status is Status.OK:
        assert m.p80_ms == 2.1 and m.reason == ""
    else:  # the figures stay, for the record, but nothing ranks by them
        assert m.p80_ms == 4.0 and m.reason.startswith("timing spread (p80 - p20) / median 1.05, above 0.5")


@pytest.mark.parametrize("mode,status,reason", [
    ("cannot", Status.CANNOT_IMPLEMENT, "can_implement returned kInvalid"),
    ("fault", Status.RUNTIME_ERROR, "RuntimeError: CUDA error: an illegal memory access was encountered"),
    ("stale", Status.WRONG_RESULT, "right after one launch, wrong after 3 more: relative error"),
])
def test_failures_are_measurements_with_a_reason(runner, mode, status, reason):
    m = _measure(runner, CpuTarget(mode))
    assert m.status is status and m.reason.startswith(reason)
    assert m.median_ms is None


def test_the_cublas_target_computes_the_problem_in_place(runner):
    job = Job.baseline(P)
    target = CublasTarget(P)
    m = _measure(runner, target, job)
    assert m.status is Status.OK and m.is_baseline and m.rel_error < 1e-2


def _measure_baseline(runner, p):
    runner._ops = allocate(p, "cpu")  # the fixture's runner has no CUDA device to allocate on
    return _measure(runner, CublasTarget(p), Job.baseline(p))


def test_the_fp8_baseline_is_scaled_mm_into_d(runner):
    p = Problem(64, 48, 64, dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16)
    m = _measure_baseline(runner, p)
    assert m.status is Status.OK and m.rel_error < 1e-2
    assert runner._ops.d.dtype == torch.bfloat16 and runner._ops.b.t().stride() == (1, 64)


@pytest.mark.parametrize("problem,reason", [
    (Problem(64, 48, 64, dtype_a=DType.E5M2, dtype_b=DType.E5M2), "torch._scaled_mm has no e5m2 x e5m2 GEMM"),
    (Problem(64, 40, 64, dtype_a=DType.E4M3, dtype_b=DType.E4M3), "torch._scaled_mm needs N a multiple of 16"),
])
def test_fp8_baselines_torch_cannot_run_are_cannot_implement(runner, problem, reason):
    m = _measure_baseline(runner, problem)
    assert m.status is Status.CANNOT_IMPLEMENT and m.reason.startswith(reason)


def test_fp8_baseline_without_scaled_mm_is_cannot_implement(runner, monkeypatch):
    p = Problem(64, 48, 64, dtype_a=DType.E4M3, dtype_b=DType.E4M3)
    monkeypatch.delattr(torch, "_scaled_mm")
    m = _measure_baseline(runner, p)
    assert m.status is Status.CANNOT_IMPLEMENT and "has no torch._scaled_mm" in m.reason


@pytest.mark.parametrize("fast", [True, False])
def test_an_fp8_kernel_is_paired_with_scaled_mm_of_the_same_accumulation(runner, monkeypatch, fast):
    p = Problem(64, 48, 64, dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16)
    runner._ops = allocate(p, "cpu")
    seen = []
    real = torch._scaled_mm

    def spy(*args, **kw):
        seen.append(kw["use_fast_accum"])
        return real(*args, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", spy)
    cfg = KernelConfig(dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_c=DType.BF16, dtype_d=DType.BF16,
                       tile_k=128, fp8_fast_accum=fast)
    job = Job(problem=p, variants=(RuntimeArgs(),), library="/x.so", symbol="ct_x", config=cfg,
              timing=TimingOptions(paired=True))
    m = _measure(runner, CpuTarget(), job)
    assert m.status is Status.OK and m.paired_ratio is not None
    assert seen == [fast] * 3  # the fake timing loop's three baseline launches
