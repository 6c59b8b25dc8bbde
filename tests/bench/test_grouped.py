"""A grouped problem in the bench on the CPU: its operands, reference and per-expert verification,
the torch._grouped_mm baseline with the expert loop and the dense GEMM, and their records."""

import json
from pathlib import Path

import pytest
import torch

from cutlass_tune.bench import Job, _runner
from cutlass_tune.bench._runner import CutlassTarget
from cutlass_tune.bench._targets import DenseTarget, ExpertLoopTarget, GroupedMmTarget, baseline_target, grouped_mm
from cutlass_tune.bench._verify import (
    allocate,
    compare,
    compare_groups,
    group_bounds,
    randomize,
    reference,
    verify_launch,
)
from cutlass_tune.measurement import SIDE_FIELDS, Baseline, Measurement, read_jsonl
from cutlass_tune.space import KernelConfig, Layout, Problem, Routing, RuntimeArgs
from cutlass_tune.status import Status

from .test_runner import CpuTarget, _fake_time_sides

DATA = Path(__file__).with_name("data")

# Expert 1 and the last have no rows; N and K keep torch._grouped_mm's 16-byte strides.
EMPTY = Problem.experts(4, 32, 48, 40, routing=Routing.HISTOGRAM, group_rows=(25, 0, 15, 0))
ZIPF = Problem.experts(8, 48, 32, 100, routing=Routing.ZIPF)
GROUPED_CONFIG = KernelConfig(grouping=EMPTY.grouping)


def _ops(problem, seed=0):
    ops = allocate(problem, "cpu")
    randomize(ops, torch.Generator().manual_seed(seed))
    return ops


@pytest.mark.parametrize("layout_b,b_shape", [(Layout.COL, (4, 32, 48)), (Layout.ROW, (4, 48, 32))])
def test_grouped_operands_are_stored_as_the_abi_says(layout_b, b_shape):
    p = Problem.experts(4, 32, 48, 40, routing=Routing.HISTOGRAM, group_rows=(25, 0, 15, 0), layout_b=layout_b)
    ops = _ops(p)
    assert ops.a.shape == (40, 48) and ops.b.shape == b_shape and ops.d.shape == (40, 32)
    assert ops.b_kn.shape == (4, 48, 32)
    assert ops.offsets.dtype == torch.int32 and ops.offsets.tolist() == [25, 25, 40, 40]
    assert group_bounds(p) == [(0, 25), (25, 25), (25, 40), (40, 40)]
    assert ops.a.abs().min() > 0 and ops.b.abs().min() > 0  # random, never zeros
    assert "offsets" in ops.inputs and torch.equal(ops.copy().offsets, ops.offsets)


def test_the_grouped_reference_multiplies_each_experts_rows_by_its_weight():
    ops = _ops(EMPTY)
    ref = reference(ops)
    w = ops.b.float()  # E x N x K: the nn.Linear weights
    assert torch.allclose(ref[:25], ops.a[:25].float() @ w[0].t())
    assert torch.allclose(ref[25:], ops.a[25:].float() @ w[2].t())


def test_the_grouped_reference_of_a_glu_pair_is_the_gated_half_of_the_product():
    """Regression: the reference wrote the M x N product into D's M x N/2 shape and failed to
    reshape it for the pair (every GLU kernel measured as a runtime error)."""
    from cutlass_tune.space import Epilogue

    p = Problem.experts(2, 32, 48, 40, routing=Routing.HISTOGRAM, group_rows=(25, 15),
                        epilogue=Epilogue.parse("silu+glu"))
    ops = _ops(p)
    ref = reference(ops)
    assert ops.d.shape == ref.shape == (40, 16)
    z = torch.cat([ops.a[:25].float() @ ops.b[0].float().t(), ops.a[25:].float() @ ops.b[1].float().t()])
    blocks = z.reshape(40, 2, 2, 8)  # gate and up interleaved by 8 columns
    want = torch.nn.functional.silu(blocks[:, :, 0]) * blocks[:, :, 1]
    assert torch.allclose(ref, want.reshape(40, 16))


def test_zipf_routing_gives_the_first_expert_the_most_rows():
    ops = _ops(ZIPF)
    rows = ZIPF.group_rows
    assert sum(rows) == 100 and rows[0] == max(rows) and ops.offsets[-1] == 100


def _right(ops):
    ops.d.copy_(reference(ops))


def test_a_wrong_expert_fails_the_kernel_and_names_the_expert():
    # Guards against a wrong expert hiding in the whole output's Frobenius error.
    p = Problem.experts(16, 32, 48, 1600, routing=Routing.ZIPF)
    ops = _ops(p)
    ref = reference(ops)
    lo, hi = group_bounds(p)[12]

    def one_expert_wrong():
        ops.d.copy_(ref)
        ops.d[lo:hi] *= 1.02  # 2% off: twice the bound for that expert, a fifth of it for the whole

    verdict = verify_launch(one_expert_wrong, ops, ref)
    assert verdict.status is Status.WRONG_RESULT
    assert verdict.reason.startswith(f"expert 12 (rows {lo}:{hi}): relative error")
    assert compare(ops.d, ref, p.dtype_d).status is Status.OK  # the whole output's error lets it pass


def test_an_unwritten_row_fails_and_a_right_output_passes():
    ops = _ops(EMPTY)
    ref = reference(ops)
    assert verify_launch(lambda: _right(ops), ops, ref).status is Status.OK

    def last_row_missed():
        saved = ops.d[39].clone()
        _right(ops)
        ops.d[39] = saved  # still the poison

    verdict = verify_launch(last_row_missed, ops, ref)
    assert verdict.status is Status.WRONG_RESULT and verdict.reason.startswith("expert 2 (rows 25:40): 32 of")
    assert compare_groups(ref.bfloat16(), ref, EMPTY).status is Status.OK


def test_a_grouped_problem_is_paired_with_torch_grouped_mm():
    assert Baseline.of(EMPTY) is Baseline.GROUPED_MM
    assert Baseline.GROUPED_MM.sides == (Baseline.EXPERT_LOOP, Baseline.DENSE)
    assert Baseline.CUBLAS.sides == () and Baseline.EAGER.sides == (Baseline.COMPILE, Baseline.CUBLASLT)
    assert isinstance(baseline_target(EMPTY, Baseline.GROUPED_MM), GroupedMmTarget)
    assert isinstance(baseline_target(EMPTY, Baseline.EXPERT_LOOP), ExpertLoopTarget)
    assert isinstance(baseline_target(EMPTY, Baseline.DENSE), DenseTarget)
    job = Job.baseline(EMPTY)
    assert job.symbol == "torch._grouped_mm" and job.kernel_name == "torch._grouped_mm"


@pytest.mark.skipif(grouped_mm() is None, reason="this torch has no grouped GEMM")
@pytest.mark.parametrize("layout_b", [Layout.COL, Layout.ROW])
def test_torch_grouped_mm_and_the_expert_loop_compute_the_reference(layout_b):
    p = Problem.experts(4, 32, 48, 40, routing=Routing.HISTOGRAM, group_rows=(25, 0, 15, 0), layout_b=layout_b)
    ops = _ops(p)
    ref = reference(ops)
    for kind in (Baseline.GROUPED_MM, Baseline.EXPERT_LOOP):
        target = baseline_target(p, kind)
        assert target.setup(RuntimeArgs(), ops) is None
        verdict = target.check(ops, ref)
        assert verdict.status is Status.OK and verdict.rel_error < 1e-2, (kind, verdict.reason)


@pytest.mark.skipif(grouped_mm() is None, reason="this torch has no grouped GEMM")
def test_torch_s_sides_of_a_glu_problem_compute_the_gated_half():
    """Regression: torch's sides of a GLU problem applied the activation to every column of the
    M x N product (`confirm` recorded torch's side of the GLU problem as a runtime error, its D
    being M x N/2)."""
    from cutlass_tune.space import Epilogue

    p = Problem.experts(2, 32, 48, 40, routing=Routing.HISTOGRAM, group_rows=(25, 15),
                        epilogue=Epilogue.parse("silu+glu"))
    ops = _ops(p)
    ref = reference(ops)
    for kind in (Baseline.GROUPED_MM, Baseline.EXPERT_LOOP, Baseline.DENSE):
        target = baseline_target(p, kind)
        assert target.setup(RuntimeArgs(), ops) is None, kind
        verdict = target.check(ops, ref)
        assert verdict.status is Status.OK and verdict.rel_error < 1e-2, (kind, verdict.reason)


@pytest.mark.parametrize("layout_b", [Layout.COL, Layout.ROW])
def test_torch_s_side_of_an_interleaved_glu_pair_multiplies_the_weights_in_a_model_s_order(monkeypatch, layout_b):
    """torch's side of a GLU problem takes the weights as a model keeps them (gate rows, then up
    rows), so its act(gate) * up reads the product's halves as views: on the kernel's interleaved
    order its halves were two copies of the product, timed with torch's side (a GLU sweep read
    1.88x over torch's GEMM and activation where the layer, running torch's own code, read 1.02)."""
    from cutlass_tune.space import GLU_BLOCK, Epilogue

    p = Problem.experts(2, 64, 48, 40, routing=Routing.HISTOGRAM, group_rows=(25, 15), layout_b=layout_b,
                        epilogue=Epilogue.parse("silu+glu"))
    ops = _ops(p)
    seen = []

    def spy(a, b, offs):
        seen.append(b)
        return grouped_mm()(a, b, offs=offs)

    monkeypatch.setattr(_targets_module(), "grouped_mm", lambda: spy)
    target = GroupedMmTarget(p)
    assert target.setup(RuntimeArgs(), ops) is None
    assert target.check(ops, reference(ops)).status is Status.OK
    b = seen[-1]
    assert b.stride() == ops.b_kn.stride()  # the layout torch is timed on is the problem's
    blocks = ops.b_kn.reshape(2, 48, 64 // (2 * GLU_BLOCK), 2, GLU_BLOCK)
    assert torch.equal(b[..., :32], blocks[:, :, :, 0].reshape(2, 48, 32))  # every gate column, in order
    assert torch.equal(b[..., 32:], blocks[:, :, :, 1].reshape(2, 48, 32))  # then every up column


def test_the_dense_gemm_is_checked_on_the_rows_it_shares_with_the_grouped_problem():
    ops = _ops(ZIPF)
    ref = reference(ops)
    dense = DenseTarget(ZIPF)
    assert dense.setup(RuntimeArgs(), ops) is None
    ops.d.fill_(float("nan"))
    assert dense.check(ops, ref).status is Status.OK
    assert ops.d.isnan().all()  # writes an output of its own, never D
    broken = DenseTarget(ZIPF)
    broken._expert = 1  # the weight of another expert than the rows it is checked on
    broken.setup(RuntimeArgs(), ops)
    broken._expert = 0
    assert broken.check(ops, ref).status is Status.WRONG_RESULT


def test_without_a_grouped_gemm_in_torch_the_baseline_is_a_reason(monkeypatch):
    monkeypatch.setattr(_targets_module(), "grouped_mm", lambda: None)
    why = GroupedMmTarget(EMPTY).setup(RuntimeArgs(), _ops(EMPTY))
    assert why == f"torch {torch.__version__} has no grouped GEMM (torch._grouped_mm)"


def test_operands_torch_grouped_mm_refuses_are_a_reason(monkeypatch):
    def refuses(*args, **kw):
        raise RuntimeError("strides should be multiple of 16 bytes\nmore")

    monkeypatch.setattr(_targets_module(), "grouped_mm", lambda: refuses)
    why = GroupedMmTarget(EMPTY).setup(RuntimeArgs(), _ops(EMPTY))
    assert why == "torch._grouped_mm: RuntimeError: strides should be multiple of 16 bytes"


def _targets_module():
    from cutlass_tune.bench import _targets

    return _targets


@pytest.fixture
def runner(monkeypatch):
    monkeypatch.setattr(_runner, "time_sides", _fake_time_sides)
    r = _runner.GpuRunner.__new__(_runner.GpuRunner)  # no CUDA: set by hand what __init__ would
    r.env, r._flush, r.side_note = None, None, ""
    r._clocks = type("NoClocks", (), {"read": lambda self: None})()
    return r


def _measure(runner, target, job):
    runner._ops = allocate(job.problem, "cpu")
    return runner._measure(job, target, job.variants[0], torch.Generator().manual_seed(0))


class GroupedCpuTarget(CpuTarget):
    """Computes a grouped D on the CPU; with `wrong_expert`, that expert's rows off by 5%."""

    def __init__(self, wrong_expert=None):
        super().__init__()
        self.wrong_expert = wrong_expert

    def launch(self):
        self.launches += 1
        self.ops.d.copy_(reference(self.ops))
        if self.wrong_expert is not None:
            lo, hi = group_bounds(self.ops.problem)[self.wrong_expert]
            self.ops.d[lo:hi] *= 1.05


@pytest.mark.skipif(grouped_mm() is None, reason="this torch has no grouped GEMM")
def test_the_grouped_baseline_row_carries_the_loop_and_the_dense_gemm_from_its_own_loop(runner, monkeypatch):
    timed = []

    def time_sides(launches, **kw):
        timed.append([type(f.__self__) for f in launches])
        return _fake_time_sides(launches, **kw)

    monkeypatch.setattr(_runner, "time_sides", time_sides)
    job = Job.baseline(EMPTY)
    m = _measure(runner, runner._target(job), job)
    assert m.status is Status.OK and m.reason == "" and m.kernel_name == "torch._grouped_mm", m.reason
    assert timed == [[GroupedMmTarget, ExpertLoopTarget, DenseTarget]]
    assert (m.median_ms, m.loop_median_ms, m.dense_median_ms) == (2.0, 2.5, 3.0)
    assert (m.loop_p20_ms, m.loop_p80_ms, m.dense_p20_ms, m.dense_p80_ms) == (2.4, 2.6, 2.9, 3.0)
    assert m.baseline_median_ms is None and m.compile_median_ms is None
    assert m.side_ratio(Baseline.EXPERT_LOOP) == pytest.approx(0.8)
    assert m.side_tflops(Baseline.DENSE) == pytest.approx(EMPTY.flops / 3e9)
    assert Measurement.from_dict(json.loads(json.dumps(m.to_dict()))) == m


def test_a_side_that_cannot_run_leaves_the_grouped_row_with_the_reason(runner, monkeypatch):
    from cutlass_tune.bench import _targets

    monkeypatch.setattr(_targets.DenseTarget, "setup", lambda self, variant, ops: "no dense GEMM here")
    monkeypatch.setattr(_targets, "grouped_mm", lambda: lambda a, b, offs: reference(runner._ops).bfloat16())
    job = Job.baseline(EMPTY)
    m = _measure(runner, runner._target(job), job)
    assert m.status is Status.OK and m.loop_median_ms == 2.5 and m.dense_median_ms is None
    assert m.reason == "torch dense not measured: no dense GEMM here"


def test_a_paired_grouped_kernel_is_timed_against_torch_grouped_mm(runner, monkeypatch):
    from cutlass_tune.bench import TimingOptions, _targets

    timed = []

    def time_sides(launches, **kw):
        timed.append([type(f.__self__) for f in launches])
        return _fake_time_sides(launches, **kw)

    monkeypatch.setattr(_runner, "time_sides", time_sides)
    monkeypatch.setattr(_targets, "grouped_mm", lambda: lambda a, b, offs: reference(runner._ops).bfloat16())
    job = Job(problem=EMPTY, variants=(RuntimeArgs(),), library="/x.so", symbol="ct_x",
              timing=TimingOptions(paired=True))
    m = _measure(runner, GroupedCpuTarget(), job)
    assert m.status is Status.OK and timed == [[GroupedCpuTarget, GroupedMmTarget]]
    assert m.baseline_median_ms == 2.5 and m.paired_ratio == pytest.approx(1.25)
    assert m.loop_median_ms is None


def test_a_kernel_wrong_on_one_expert_is_a_wrong_result_naming_it(runner):
    job = Job(problem=ZIPF, variants=(RuntimeArgs(),), library="/x.so", symbol="ct_x")
    m = _measure(runner, GroupedCpuTarget(wrong_expert=3), job)
    lo, hi = group_bounds(ZIPF)[3]
    assert m.status is Status.WRONG_RESULT and m.reason.startswith(f"expert 3 (rows {lo}:{hi}):")
    assert m.median_ms is None


def test_a_grouped_job_checks_the_kernel_against_the_problem():
    from cutlass_tune.bench import InvalidJobError

    with pytest.raises(InvalidJobError, match="grouping"):
        Job(problem=EMPTY, variants=(RuntimeArgs(),), library="/x.so", symbol="ct_x", config=KernelConfig())
    job = Job(problem=EMPTY, variants=(RuntimeArgs(),), library="/x.so", symbol="ct_x", config=GROUPED_CONFIG)
    assert job.kernel_name == GROUPED_CONFIG.name and "_grouped" in job.kernel_name


class _Gemm:
    def initialize(self, args, workspace, stream):
        pass

    def close(self):
        pass


class _Kernel:
    """Records the arguments; asks for a workspace of 256 bytes (the per-group arrays)."""

    def create(self):
        return _Gemm()

    def can_implement(self, args):
        self.args = args
        return 0

    def workspace_size(self, args):
        return 256


def test_a_grouped_kernel_gets_the_experts_and_offsets_and_no_rearm(monkeypatch):
    # Guards against timing a memset of the per-group arrays, which `run` rebuilds anyway.
    monkeypatch.setattr(_runner, "_stream", lambda: 0)
    monkeypatch.setattr(torch, "empty", _cpu(torch.empty))
    ops = _ops(EMPTY)
    kernel = _Kernel()
    target = CutlassTarget(kernel, 0, 132)
    assert target.setup(RuntimeArgs(), ops) is None
    assert (kernel.args.groups, kernel.args.offsets) == (4, ops.offsets.data_ptr())
    assert (kernel.args.m, kernel.args.n, kernel.args.k) == (40, 32, 48)
    assert target.rearm is None


def _cpu(empty):
    def on_cpu(*args, **kw):
        kw.pop("device", None)
        return empty(*args, **kw)
    return on_cpu


def test_an_old_record_reads_without_the_grouped_fields():
    m = Measurement(EMPTY, None, RuntimeArgs(), Status.OK, is_baseline=True, symbol="torch._grouped_mm",
                    median_ms=1.0, loop_median_ms=1.5, dense_median_ms=0.8)
    data = m.to_dict()
    assert data["problem"]["group_rows"] == [25, 0, 15, 0] and data["loop_median_ms"] == 1.5
    for prefix in SIDE_FIELDS.values():
        for name in ("median_ms", "p20_ms", "p80_ms"):
            data.pop(f"{prefix}_{name}")
    old = Measurement.from_dict(data)
    assert old.loop_median_ms is None and old.side_ratio(Baseline.DENSE) is None and old.problem == EMPTY


def _grouped_records():
    base = Measurement(ZIPF, None, RuntimeArgs(), Status.OK, symbol="torch._grouped_mm", is_baseline=True,
                       median_ms=0.5, p20_ms=0.49, p80_ms=0.52, samples=50, tflops=0.0307, rel_error=2e-3,
                       method="events", loop_median_ms=1.5, loop_p20_ms=1.4, loop_p80_ms=1.6, dense_median_ms=0.4,
                       dense_p20_ms=0.39, dense_p80_ms=0.41)
    kernel = Measurement(ZIPF, GROUPED_CONFIG, RuntimeArgs(), Status.OK, symbol="ct_x", median_ms=0.45,
                         p20_ms=0.44, p80_ms=0.46, samples=50, tflops=0.0341, rel_error=2e-3, method="events",
                         baseline_median_ms=0.5, baseline_p20_ms=0.49, baseline_p80_ms=0.52)
    return [base, kernel]


def test_the_stored_grouped_records_still_load():
    # data/measurements-v2-grouped.jsonl: the first grouped rows (schema 2 with loop_* and dense_*).
    loaded = list(read_jsonl(DATA / "measurements-v2-grouped.jsonl"))
    assert loaded == _grouped_records()
    base, kernel = loaded
    assert base.problem.group_rows == ZIPF.group_rows and base.side_ratio(Baseline.EXPERT_LOOP) == pytest.approx(1 / 3)
    assert kernel.paired_ratio == pytest.approx(0.5 / 0.45) and kernel.config.grouping is ZIPF.grouping
