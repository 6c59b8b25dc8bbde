"""On a Hopper GPU: fused-epilogue and scaled-fp8 kernels against the fp32 reference, and the two
torch baselines (eager, torch.compile) timed by the same harness.

Run with `python3 -m pytest tests/bench/test_gpu_epilogue.py -m gpu -s` on the GPU host (`-s`
prints errors and ratios; nvcc builds the four kernels into the kernel cache first, 1-2 minutes
on 16 cores).
"""

import dataclasses

import pytest
import torch

from cutlass_tune._torch import ACTIVATION
from cutlass_tune.bench import GpuRunner, Job, TimingOptions
from cutlass_tune.bench._targets import TorchTarget
from cutlass_tune.bench._verify import compare, reference
from cutlass_tune.compile import compile_kernels
from cutlass_tune.kernel import LoadedKernel, make_args
from cutlass_tune.measurement import Baseline, TimingMethod
from cutlass_tune.space import Activation, DType, Epilogue, KernelConfig, Problem, RuntimeArgs, Scaling
from cutlass_tune.status import Status

from .conftest import spy_on_timing

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

E4M3 = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_c=DType.BF16, dtype_d=DType.BF16)
BIAS_SILU = Epilogue(bias=True, activation=Activation.SILU)
BIAS_GELU = Epilogue(bias=True, activation=Activation.GELU)
RESIDUAL_GELU_TANH = Epilogue(bias=True, activation=Activation.GELU_TANH, residual=True)
CONFIGS = {
    "bias+silu": KernelConfig(tile_m=128, tile_n=256, tile_k=64, cluster_m=2, epilogue=BIAS_SILU),
    "bias+gelu": KernelConfig(tile_m=128, tile_n=256, tile_k=64, cluster_m=2, epilogue=BIAS_GELU),
    "bias+gelu_tanh+residual": KernelConfig(tile_m=128, tile_n=128, tile_k=64, epilogue=RESIDUAL_GELU_TANH),
    "fp8 rowcol": KernelConfig(**E4M3, tile_m=128, tile_n=128, tile_k=128, cluster_m=2, scaling=Scaling.ROWCOL),
}
M, N, K = 2048, 4096, 4096
PROBLEMS = {
    "bias+silu": Problem(M, N, K, epilogue=BIAS_SILU),
    "bias+gelu": Problem(M, N, K, epilogue=BIAS_GELU),
    "bias+gelu_tanh+residual": Problem(M, N, K, epilogue=RESIDUAL_GELU_TANH),
    "fp8 rowcol": Problem(M, N, K, dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16, scaling=Scaling.ROWCOL),
}
SHORT = TimingOptions(budget_ms=30, warmup_ms=5)


@pytest.fixture(scope="module")
def kernels():
    results = compile_kernels(list(CONFIGS.values()))  # the user's kernel cache: a rerun finds them
    for r in results:
        assert r.status is Status.OK, f"{r.config.name}: {r.reason} (log {r.log_path})"
    return dict(zip(CONFIGS, results))


def _launch_once(compiled, problem):
    """The kernel once on fresh operands, D poisoned first; the operands, synchronized."""
    from cutlass_tune.bench._verify import allocate, randomize

    ops = allocate(problem, "cuda:0")
    randomize(ops, torch.Generator("cuda:0").manual_seed(0))
    extras = {name: t.data_ptr() for name, t in ops.inputs.items() if name not in ("a", "b")}
    args = make_args(problem, RuntimeArgs(), a=ops.a.data_ptr(), b=ops.b.data_ptr(), d=ops.d.data_ptr(),
                     device_id=0, sm_count=torch.cuda.get_device_properties(0).multi_processor_count, **extras)
    kernel = LoadedKernel(compiled.library, compiled.symbol)
    assert kernel.can_implement(args) == 0
    size = kernel.workspace_size(args)
    workspace = torch.zeros(size, dtype=torch.uint8, device="cuda:0") if size else None
    stream = torch.cuda.current_stream().cuda_stream
    ops.d.fill_(float("nan"))
    with kernel.create() as gemm:
        gemm.initialize(args, workspace.data_ptr() if workspace is not None else None, stream)
        gemm.run(stream)
        torch.cuda.synchronize()
    return ops


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_fused_kernel_matches_the_reference(kernels, name):
    problem = PROBLEMS[name]
    ops = _launch_once(kernels[name], problem)
    verdict = compare(ops.d, reference(ops), DType.BF16, fp8_inputs=problem.dtype_a.is_fp8)
    print(f"\n{name}: rel error {verdict.rel_error:.2e}, worst element {verdict.worst_error:.3f} RMS")
    assert verdict.status is Status.OK, verdict.reason


@pytest.mark.parametrize("name,other", [("bias+gelu", Activation.GELU_TANH),
                                        ("bias+gelu_tanh+residual", Activation.GELU)])
def test_the_kernel_computes_the_gelu_form_it_names(kernels, name, other):
    # The tolerances cannot tell erf GELU from its tanh form (2e-4 apart); over 8M outputs their
    # systematic difference shows beside the rounding noise.
    problem = PROBLEMS[name]
    ops = _launch_once(kernels[name], problem)
    wrong_ops = dataclasses.replace(ops, problem=dataclasses.replace(
        problem, epilogue=dataclasses.replace(problem.epilogue, activation=other)))
    right, wrong = reference(ops), reference(wrong_ops)
    assert ACTIVATION[other] is not ACTIVATION[problem.epilogue.activation]
    err_right = torch.linalg.vector_norm(ops.d.float() - right).item()
    err_wrong = torch.linalg.vector_norm(ops.d.float() - wrong).item()
    print(f"\n{name}: error against its own GELU {err_right:.4g}, against the other {err_wrong:.4g}")
    assert err_right < err_wrong


@pytest.mark.parametrize("name", list(CONFIGS))
def test_kernel_and_both_torch_baselines_are_timed_by_the_same_harness(kernels, name, monkeypatch):
    timed = spy_on_timing(monkeypatch)
    problem = PROBLEMS[name]
    runner = GpuRunner(0)
    [base] = runner(Job.baseline(problem, timing=SHORT))
    assert base.status is Status.OK and base.is_baseline, base.reason
    assert base.kernel_name == Baseline.EAGER.value and base.reason == "" and base.compile_median_ms, base.reason
    [m] = runner(Job.for_kernel(kernels[name], problem, (RuntimeArgs(),),
                                timing=dataclasses.replace(SHORT, paired=True)))
    assert m.status is Status.OK, m.reason
    assert timed == [("TorchTarget", "TorchTarget"), ("CutlassTarget", "TorchTarget")]
    assert m.baseline_median_ms and m.paired_ratio and base.compile_ratio
    print(f"\n{name}: kernel {m.tflops:.0f} TFLOP/s; ratio to eager {m.paired_ratio:.3f} (paired), to "
          f"torch.compile {base.to_compile(m.paired_ratio):.3f}; torch.compile / eager {base.compile_ratio:.3f}")


def test_the_paired_sides_are_eager_for_the_kernel_and_compile_for_the_baseline(monkeypatch):
    from cutlass_tune.bench import _runner

    sides = []
    real = _runner.time_sides

    def spy(launches, **kw):
        sides.extend(getattr(f, "__self__", None) for f in launches[1:])
        return real(launches, **kw)

    monkeypatch.setattr(_runner, "time_sides", spy)
    runner = GpuRunner(0)
    [base] = runner(Job.baseline(PROBLEMS["bias+silu"], timing=SHORT))
    assert isinstance(sides[0], TorchTarget) and sides[0].kind is Baseline.COMPILE
    assert base.status is Status.OK and base.compile_median_ms


@pytest.mark.parametrize("method", [TimingMethod.GRAPH, TimingMethod.SUSTAINED])
def test_both_torch_baselines_time_inside_cuda_graphs(method):
    # Graph and sustained timing capture each side in a CUDA graph: torch's allocations and
    # Inductor's Triton kernels must capture as cuBLAS does.
    runner = GpuRunner(0)
    timing = TimingOptions(method=method, budget_ms=300 if method is TimingMethod.SUSTAINED else 30, warmup_ms=5)
    for name in ("bias+gelu", "fp8 rowcol"):
        [base] = runner(Job.baseline(PROBLEMS[name], timing=timing))
        assert base.status is Status.OK and base.compile_median_ms, (name, base.reason)
        print(f"\n{name} {method.value}: eager {base.median_ms:.3f} ms, torch.compile {base.compile_median_ms:.3f} ms")
