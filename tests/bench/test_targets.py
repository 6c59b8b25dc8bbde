"""The baselines of fused problems (torch eager, torch.compile), how the runner times and records them, on the CPU."""

import dataclasses

import pytest
import torch

from cutlass_tune._torch import expand_blockwise_scale_b
from cutlass_tune.bench import Job, TimingOptions, _runner, _targets
from cutlass_tune.bench._runner import CublasTarget, CutlassTarget
from cutlass_tune.bench._targets import TorchTarget, baseline_target, compiled_function, eager_function
from cutlass_tune.bench._verify import allocate, compare, randomize, reference
from cutlass_tune.measurement import BASELINE_NAMES, Baseline, Measurement
from cutlass_tune.space import Activation, DType, Epilogue, Problem, RuntimeArgs, Scaling
from cutlass_tune.status import Status

from .test_runner import CpuTarget, _fake_time_sides

ACTIVATIONS = {Activation.SILU: torch.nn.functional.silu, Activation.GELU: torch.nn.functional.gelu}

SILU = Epilogue(bias=True, activation=Activation.SILU)
FUSED = Problem(64, 48, 32, epilogue=SILU)


def _ops(problem, seed=0):
    ops = allocate(problem, "cpu")
    randomize(ops, torch.Generator().manual_seed(seed))
    return ops


def _args(ops):
    return ops.a_mk, ops.b_kn, ops.bias, ops.c, ops.scale_a, ops.scale_b


def test_which_baseline_a_problem_gets():
    assert Baseline.of(Problem(64, 48, 32)) is Baseline.CUBLAS
    assert Baseline.of(Problem(64, 48, 64, dtype_a=DType.E4M3, dtype_b=DType.E4M3)) is Baseline.CUBLAS
    assert Baseline.of(FUSED) is Baseline.EAGER
    assert Baseline.of(Problem(64, 48, 64, dtype_a=DType.E4M3, dtype_b=DType.E4M3, scaling=Scaling.ROWCOL)) \
        is Baseline.EAGER
    assert BASELINE_NAMES == {"cuBLAS", "torch eager", "torch.compile", "cuBLASLt epilogue", "torch._grouped_mm",
                              "torch expert loop", "torch dense"}
    assert isinstance(baseline_target(Problem(64, 48, 32), Baseline.CUBLAS), CublasTarget)
    assert baseline_target(FUSED, Baseline.COMPILE).kind is Baseline.COMPILE


@pytest.mark.parametrize("epilogue", [
    SILU,
    Epilogue(bias=True, activation=Activation.GELU),
    Epilogue(bias=True, activation=Activation.GELU_TANH),
    Epilogue(activation=Activation.RELU),
    Epilogue(residual=True),  # torch.addmm(c, a, w.t())
    Epilogue(bias=True, activation=Activation.GELU, residual=True),
    Epilogue(bias=True, activation=Activation.SILU, gated=True),  # silu(c) * F.linear(a, w, bias)
    Epilogue(activation=Activation.GELU, gated=True),
])
def test_the_eager_function_computes_the_reference(epilogue):
    p = Problem(128, 96, 64, epilogue=epilogue)
    ops = _ops(p)
    out = eager_function(p)(*_args(ops))
    assert out.dtype == torch.bfloat16 and out.shape == (128, 96)
    assert compare(out, reference(ops), DType.BF16).status is Status.OK


def test_the_eager_function_is_what_a_user_writes():
    ops = _ops(FUSED)
    w = ops.b  # N x K: the nn.Linear weight
    expected = torch.nn.functional.silu(torch.nn.functional.linear(ops.a, w, ops.bias))
    assert torch.equal(eager_function(FUSED)(*_args(ops)), expected)


@pytest.mark.parametrize("scaling", [Scaling.TENSOR, Scaling.ROWCOL])
@pytest.mark.parametrize("bias_after", [False, True])
def test_the_fp8_eager_function_is_scaled_mm_with_the_scales(scaling, bias_after):
    p = Problem(64, 48, 64, dtype_a=DType.E4M3, dtype_b=DType.E4M3, epilogue=SILU, scaling=scaling)
    ops = _ops(p)
    try:
        out = eager_function(p, bias_after=bias_after)(*_args(ops))
    except (RuntimeError, NotImplementedError) as err:  # a torch without _scaled_mm on the CPU
        pytest.skip(f"torch._scaled_mm on the CPU: {err}")
    verdict = compare(out, reference(ops), DType.BF16, fp8_inputs=True)
    assert verdict.status is Status.OK and verdict.rel_error < 1e-2


def test_a_torch_target_writes_d_only_when_verified():
    ops = _ops(FUSED)
    target = TorchTarget(FUSED, Baseline.EAGER)
    assert target.setup(RuntimeArgs(), ops) is None
    ops.d.fill_(float("nan"))
    target.launch()  # timed: the user's call, into a new tensor
    assert ops.d.isnan().all()
    target.once()
    assert compare(ops.d, reference(ops), DType.BF16).status is Status.OK
    twin = target.sibling()
    assert isinstance(twin, TorchTarget) and twin.kind is Baseline.EAGER


def test_a_torch_target_captured_for_sustained_timing_copies_nothing(monkeypatch):
    # Guards against timing eager with an extra pass over D (sustained timing captures `once`).
    ops = _ops(FUSED)
    target = TorchTarget(FUSED, Baseline.EAGER)
    target.setup(RuntimeArgs(), ops)
    ops.d.fill_(float("nan"))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(target, "_call", lambda: type("Captured", (), {"is_cuda": True})())
    target.once()
    assert ops.d.isnan().all()


def test_a_problem_torch_has_no_call_for_is_a_reason():
    p = Problem(64, 48, 32, dtype_d=DType.F16, epilogue=SILU)
    assert TorchTarget(p, Baseline.EAGER).setup(RuntimeArgs(), _ops(p)) == "F.linear has no bf16 x bf16 -> f16 GEMM"


def test_torch_compile_of_the_same_function_gives_the_same_result():
    p = Problem(64, 48, 32, epilogue=Epilogue(bias=True, activation=Activation.GELU_TANH, residual=True))
    ops = _ops(p)
    target = TorchTarget(p, Baseline.COMPILE)
    assert target.setup(RuntimeArgs(), ops) is None  # compiles and runs once
    target.once()
    # Inductor fuses the residual and the activation in fp32, where eager rounds between them.
    verdict = compare(ops.d, reference(ops), DType.BF16)
    assert verdict.status is Status.OK and verdict.rel_error < 4e-3


def test_a_new_problem_resets_dynamo(monkeypatch):
    # Guards against Dynamo's recompile limit: past it, a compiled function runs eager silently.
    compiled, resets = [], []
    monkeypatch.setattr(_targets, "_compiled", {})
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(kw) or fn)
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))
    first = compiled_function(FUSED)
    assert compiled_function(FUSED) is first and len(compiled) == 1 and not resets
    compiled_function(Problem(64, 48, 32, epilogue=Epilogue(bias=True)))
    assert len(compiled) == 2 and len(resets) == 1
    assert compiled[0] == {"fullgraph": True, "dynamic": False}  # the default mode


def test_a_plain_baseline_job_is_cublas_and_a_fused_one_torch_eager():
    plain = Job.baseline(Problem(64, 48, 32))
    assert plain.symbol == "" and plain.kernel_name == "cuBLAS"
    assert plain.measurement(RuntimeArgs(), Status.OK).kernel_name == "cuBLAS"
    fused = Job.baseline(FUSED)
    assert fused.symbol == "torch eager" and fused.is_baseline
    m = fused.measurement(RuntimeArgs(), Status.OK, median_ms=2.0, baseline_median_ms=1.6, baseline_p20_ms=1.5,
                          baseline_p80_ms=1.7, baseline_energy_mj=3.0, baseline_sm_mhz=1500.0)
    assert m.kernel_name == "torch eager" and m.baseline_median_ms is None and m.paired_ratio is None
    assert (m.compile_median_ms, m.compile_p20_ms, m.compile_p80_ms) == (1.6, 1.5, 1.7)
    assert m.compile_ratio == pytest.approx(1.25) and m.to_compile(1.5) == pytest.approx(1.2)
    assert Measurement.from_dict(m.to_dict()) == m


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


def test_a_fused_baseline_row_carries_torch_compile_from_its_own_loop(runner, monkeypatch):
    timed = []

    def time_sides(launches, **kw):
        timed.extend(getattr(f, "__self__", None) for f in launches[1:])
        return _fake_time_sides(launches, **kw)

    monkeypatch.setattr(_runner, "time_sides", time_sides)
    monkeypatch.setattr(_targets, "compiled_function", eager_function)  # compiling is tested above
    job = Job.baseline(FUSED)
    m = _measure(runner, runner._target(job), job)
    assert m.status is Status.OK and m.reason == "" and m.kernel_name == "torch eager" and m.rel_error < 1e-2
    side = timed[0]
    assert isinstance(side, TorchTarget) and side.kind is Baseline.COMPILE
    assert (m.median_ms, m.compile_median_ms, m.compile_p20_ms, m.compile_p80_ms) == (2.0, 2.5, 2.4, 2.6)
    assert m.baseline_median_ms is None and m.compile_ratio == pytest.approx(0.8)


def test_torch_compile_failing_leaves_the_eager_row_with_the_reason(runner, monkeypatch):
    def broken(problem, **kw):
        def fn(*args):
            raise RuntimeError("Inductor: no C++ compiler\nmore")
        return fn

    monkeypatch.setattr(_targets, "compiled_function", broken)
    job = Job.baseline(FUSED)
    m = _measure(runner, runner._target(job), job)
    assert m.status is Status.OK and m.median_ms == 2.0 and m.compile_median_ms is None
    assert m.reason == "torch.compile not measured: torch.compile: RuntimeError: Inductor: no C++ compiler"


def test_torch_compile_giving_a_wrong_result_is_not_timed(runner, monkeypatch):
    monkeypatch.setattr(_targets, "compiled_function",
                        lambda problem, **kw: lambda *args: eager_function(problem)(*args) * 2)
    job = Job.baseline(FUSED)
    m = _measure(runner, runner._target(job), job)
    assert m.status is Status.OK and m.compile_median_ms is None
    assert m.reason.startswith("torch.compile not measured: wrong result: relative error")


def test_a_paired_kernel_of_a_fused_problem_is_timed_against_torch_eager(runner, monkeypatch):
    timed = []

    def time_sides(launches, **kw):
        timed.extend(getattr(f, "__self__", None) for f in launches[1:])
        return _fake_time_sides(launches, **kw)

    monkeypatch.setattr(_runner, "time_sides", time_sides)

    class FusedCpuTarget(CpuTarget):
        def launch(self):
            self.launches += 1
            self.ops.d.copy_(reference(self.ops))

    job = Job(problem=FUSED, variants=(RuntimeArgs(),), library="/x.so", symbol="ct_x",
              timing=TimingOptions(paired=True))
    m = _measure(runner, FusedCpuTarget(), job)
    assert m.status is Status.OK and not m.is_baseline and m.compile_median_ms is None
    assert isinstance(timed[0], TorchTarget) and timed[0].kind is Baseline.EAGER
    assert m.baseline_median_ms == 2.5 and m.paired_ratio == pytest.approx(1.25)


class _Gemm:
    def initialize(self, args, workspace, stream):
        pass

    def close(self):
        pass


class _Kernel:
    def __init__(self):
        self.args = None

    def create(self):
        return _Gemm()

    def can_implement(self, args):
        self.args = args
        return 0

    def workspace_size(self, args):
        return 0


def test_the_kernel_gets_the_epilogue_operands(monkeypatch):
    monkeypatch.setattr(_runner, "_stream", lambda: 0)
    p = Problem(64, 48, 64, dtype_a=DType.E4M3, dtype_b=DType.E4M3, scaling=Scaling.ROWCOL,
                epilogue=Epilogue(bias=True, activation=Activation.GELU, residual=True))
    ops = _ops(p)
    kernel = _Kernel()
    assert CutlassTarget(kernel, 0, 132).setup(RuntimeArgs(), ops) is None
    args = kernel.args
    assert (args.c, args.bias) == (ops.c.data_ptr(), ops.bias.data_ptr())
    assert (args.scale_a, args.scale_b) == (ops.scale_a.data_ptr(), ops.scale_b.data_ptr())
    assert (args.alpha, args.beta, args.d) == (1.0, 1.0, ops.d.data_ptr())
    plain = _ops(Problem(64, 48, 32))
    CutlassTarget(kernel, 0, 132).setup(RuntimeArgs(), plain)
    assert kernel.args.c == plain.d.data_ptr() and kernel.args.beta == 0.0 and not kernel.args.bias


def test_a_narrow_n_blockwise_kernel_gets_b_scales_at_its_granularity(monkeypatch):
    monkeypatch.setattr(_runner, "_stream", lambda: 0)
    ops = _ops(Problem(64, 320, 256, dtype_a=DType.E4M3, dtype_b=DType.E4M3, scaling=Scaling.BLOCKWISE))
    kernel = _Kernel()
    target = CutlassTarget(kernel, 0, 132, scale_n=64)
    assert target.setup(RuntimeArgs(), ops) is None
    assert kernel.args.scale_a == ops.scale_a.data_ptr() and kernel.args.scale_b != ops.scale_b.data_ptr()
    kept = target._scale_b  # alive while the kernel may read it
    assert kernel.args.scale_b == kept.data_ptr()
    assert torch.equal(kept, expand_blockwise_scale_b(ops.scale_b, 320, 64))
    target.sibling().setup(RuntimeArgs(), ops)
    assert kernel.args.scale_b != ops.scale_b.data_ptr()  # the sibling reads them expanded too
    CutlassTarget(kernel, 0, 132).setup(RuntimeArgs(), ops)
    assert kernel.args.scale_b == ops.scale_b.data_ptr()


RELU = Problem(64, 48, 32, epilogue=Epilogue(bias=True, activation=Activation.RELU))


@pytest.mark.parametrize("epilogue, applies", [
    (Epilogue(bias=True, activation=Activation.RELU), True),
    (Epilogue(bias=True, activation=Activation.GELU_TANH), True),
    (Epilogue(bias=True, activation=Activation.GELU), False),  # cuBLASLt's GELU is the tanh form
    (Epilogue(bias=True, activation=Activation.SILU), False),
    (Epilogue(activation=Activation.RELU), False),  # _addmm_activation takes a bias
    (Epilogue(bias=True, activation=Activation.RELU, residual=True), False),
    (Epilogue(bias=True), False),  # eager's F.linear already is cuBLASLt's bias epilogue
])
def test_cublaslt_is_a_baseline_only_where_it_computes_the_same_function(epilogue, applies):
    assert Baseline.CUBLASLT.applies(Problem(64, 48, 32, epilogue=epilogue)) is applies
    assert not Baseline.CUBLASLT.applies(Problem(64, 48, 32, dtype_d=DType.F32, epilogue=epilogue))
    assert not Baseline.CUBLASLT.applies(Problem(64, 48, 64, dtype_a=DType.E4M3, dtype_b=DType.E4M3, epilogue=epilogue))
    assert Baseline.COMPILE.applies(Problem(64, 48, 32, epilogue=epilogue))


def test_the_cublaslt_baseline_is_addmm_activation_with_the_bias():
    ops = _ops(RELU)
    target = baseline_target(RELU, Baseline.CUBLASLT)
    assert target.setup(RuntimeArgs(), ops) is None
    target.once()
    assert compare(ops.d, reference(ops), DType.BF16).status is Status.OK
    expected = torch._addmm_activation(ops.bias, ops.a_mk, ops.b_kn)
    assert torch.equal(ops.d, expected)
    silu = TorchTarget(FUSED, Baseline.CUBLASLT)
    assert silu.setup(RuntimeArgs(), _ops(FUSED)) == "cuBLASLt epilogue does not compute bias+silu on bf16 -> bf16"


def test_the_cublaslt_gelu_is_not_measured_off_cuda():
    # Guards against timing the CPU kernel's erf GELU as cuBLASLt's tanh GELU epilogue.
    p = Problem(64, 48, 32, epilogue=Epilogue(bias=True, activation=Activation.GELU_TANH))
    why = TorchTarget(p, Baseline.CUBLASLT).setup(RuntimeArgs(), _ops(p))
    assert why is not None and "erf GELU off CUDA" in why


def test_a_bias_relu_baseline_row_times_cublaslt_beside_eager_and_compile(runner, monkeypatch):
    timed = []

    def time_sides(launches, **kw):
        timed.extend(getattr(f, "__self__", None) for f in launches[1:])
        return _fake_time_sides(launches, **kw)

    monkeypatch.setattr(_runner, "time_sides", time_sides)
    monkeypatch.setattr(_targets, "compiled_function", eager_function)
    job = Job.baseline(RELU)
    m = _measure(runner, runner._target(job), job)
    assert m.status is Status.OK and m.reason == ""
    assert [t.kind for t in timed] == [Baseline.COMPILE, Baseline.CUBLASLT]
    assert (m.median_ms, m.compile_median_ms, m.lt_median_ms, m.lt_p20_ms) == (2.0, 2.5, 3.0, 2.9)
    assert m.strongest() == (Baseline.EAGER, 1.0)  # the fake times eager fastest


def test_the_strongest_torch_path_is_the_fastest_of_the_row():
    row = Job.baseline(RELU).measurement(RuntimeArgs(), Status.OK, median_ms=0.30, compile_median_ms=0.28,
                                         lt_median_ms=0.24)
    side, factor = row.strongest()
    assert side is Baseline.CUBLASLT and factor == pytest.approx(1.25)
    assert row.to_strongest(1.5) == (Baseline.CUBLASLT, pytest.approx(1.2))
    assert row.side_ratio(Baseline.CUBLASLT) == pytest.approx(1.25)
    no_sides = dataclasses.replace(row, compile_median_ms=None, lt_median_ms=None)
    assert no_sides.strongest() == (Baseline.EAGER, 1.0)
    plain = Job.baseline(Problem(64, 48, 32)).measurement(RuntimeArgs(), Status.OK, median_ms=0.2)
    assert plain.strongest() == (Baseline.CUBLAS, 1.0)
    failed = Job.baseline(RELU).measurement(RuntimeArgs(), Status.RUNTIME_ERROR, "x")
    assert failed.strongest() is None and failed.to_strongest(1.1) is None
    assert Measurement.from_dict(row.to_dict()) == row


@pytest.mark.parametrize("activation", [Activation.SILU, Activation.GELU])
@pytest.mark.parametrize("bias", [True, False])
def test_the_gated_eager_function_multiplies_the_activated_gate(activation, bias):
    # C is the gate's pre-activation: D = act(C) * (x W^T + b), as a gated MLP writes it.
    p = Problem(128, 96, 64, epilogue=Epilogue(bias=bias, activation=activation, gated=True))
    g = torch.Generator().manual_seed(0)
    a, w, c = (torch.randn(shape, generator=g).bfloat16() for shape in ((128, 64), (96, 64), (128, 96)))
    b = torch.randn(96, generator=g).bfloat16() if bias else None
    out = eager_function(p)(a, w.t(), b, c, None, None)
    up = a.float() @ w.float().t() + (b.float() if bias else 0)
    expected = ACTIVATIONS[activation](c.float()) * up
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), expected, rtol=2e-2, atol=2e-2 * expected.abs().max().item())
    assert not Baseline.CUBLASLT.applies(p)


def test_the_residual_eager_function_adds_c_after_the_linear():
    p = Problem(64, 48, 32, epilogue=Epilogue(bias=True, residual=True))
    ops = _ops(p)
    expected = torch.nn.functional.linear(ops.a, ops.b, ops.bias) + ops.c
    assert torch.equal(eager_function(p)(*_args(ops)), expected)
