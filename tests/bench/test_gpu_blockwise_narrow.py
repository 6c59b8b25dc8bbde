"""On a Hopper GPU: block-wise fp8 kernels narrower along N than the 128-column scale block
(scale_n 64 and 32, tile N to match) against the fp32 reference of the original math, with the
caller's 128 x 128 B scales expanded for them by the bench (`GpuRunner`) and by the runtime
(`Gemm`); the same kernel given the scales unexpanded fails, so the checks can.

Run with `python3 -m pytest tests/bench/test_gpu_blockwise_narrow.py -m gpu -s` on the GPU host
(nvcc builds the three kernels into the kernel cache first, about two minutes).
"""

import pytest
import torch

from cutlass_tune.bench import GpuRunner, Job, TimingOptions, compare
from cutlass_tune.bench._verify import allocate, randomize, reference
from cutlass_tune.compile import compile_kernels
from cutlass_tune.kernel import LoadedKernel, make_args
from cutlass_tune.runtime import Gemm
from cutlass_tune.space import DType, EpilogueSchedule, KernelConfig, KernelSchedule, Problem, RuntimeArgs, Scaling
from cutlass_tune.status import Status

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

BW = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_c=DType.BF16, dtype_d=DType.BF16, tile_k=128,
          scaling=Scaling.BLOCKWISE, epilogue_source=False)
PINGPONG = dict(tile_m=64, kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA)
NARROW = [KernelConfig(**BW, **PINGPONG, tile_n=64, scale_n=64), KernelConfig(**BW, tile_n=64, scale_n=64),
          KernelConfig(**BW, **PINGPONG, tile_n=32, scale_n=32)]
FP8 = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16, scaling=Scaling.BLOCKWISE)
# DeepSeek-V3's expert down at decode, and an N that ends in half a 128-column block.
PROBLEMS = [Problem(32, 7168, 2048, **FP8), Problem(64, 4160, 1024, **FP8)]


@pytest.fixture(scope="module")
def kernels():
    results = compile_kernels(NARROW)
    for r in results:
        assert r.status is Status.OK, f"{r.config.name}: {r.reason} (log {r.log_path})"
    return results


def _operands(problem):
    ops = allocate(problem, "cuda:0")
    randomize(ops, torch.Generator("cuda:0").manual_seed(0))
    return ops


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.name)
def test_the_bench_verifies_narrow_kernels_against_the_reference(kernels, problem):
    runner = GpuRunner(0)
    for kernel in kernels:
        [row] = runner(Job.for_kernel(kernel, problem, [RuntimeArgs()], timing=TimingOptions(budget_ms=30,
                                                                                              warmup_ms=5)))
        print(f"\n{kernel.config.name} {problem.name}: {row.status.value} {row.median_ms} ms rel {row.rel_error}")
        assert row.status is Status.OK, (kernel.config.name, row.reason)


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.name)
def test_the_runtime_expands_torchs_scales_for_a_narrow_kernel(kernels, problem):
    ops = _operands(problem)
    ref = reference(ops)
    for kernel in kernels:
        gemm = Gemm(kernel.config)
        for _ in range(2):  # the second call reads the kept expansion
            out = gemm(ops.a_mk, ops.b_kn, scale_a=ops.scale_a, scale_b=ops.scale_b)
            verdict = compare(out, ref, DType.BF16, fp8_inputs=True)
            assert verdict.status is Status.OK, (kernel.config.name, verdict.reason)


def test_a_narrow_kernel_given_the_128_column_scales_is_wrong(kernels):
    problem = PROBLEMS[0]
    ops = _operands(problem)
    # The weight's (N/128, K/128) scales as they are, at the head of a buffer of the (N/64, K/128)
    # the kernel reads (so that it reads nothing outside it).
    unexpanded = torch.zeros(problem.n // 64, problem.k // 128, dtype=torch.float32, device="cuda:0")
    unexpanded[:problem.n // 128].copy_(ops.scale_b.t())
    kernel = LoadedKernel(kernels[0].library, kernels[0].symbol)
    args = make_args(problem, RuntimeArgs(), a=ops.a.data_ptr(), b=ops.b.data_ptr(), d=ops.d.data_ptr(),
                     scale_a=ops.scale_a.data_ptr(), scale_b=unexpanded.data_ptr(), device_id=0,
                     sm_count=torch.cuda.get_device_properties(0).multi_processor_count)
    stream = torch.cuda.current_stream().cuda_stream
    ops.d.fill_(float("nan"))
    with kernel.create() as gemm:
        gemm.initialize(args, None, stream)
        gemm.run(stream)
        torch.cuda.synchronize()
    assert compare(ops.d, reference(ops), DType.BF16, fp8_inputs=True).status is not Status.OK


def test_a_captured_narrow_kernel_reads_the_kept_expansion(kernels):
    problem = PROBLEMS[0]
    ops = _operands(problem)
    gemm, out = Gemm(kernels[0].config), torch.empty(problem.m, problem.n, dtype=torch.bfloat16, device="cuda:0")
    gemm(ops.a_mk, ops.b_kn, out, scale_a=ops.scale_a, scale_b=ops.scale_b)  # warm-up keeps the expansion
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm(ops.a_mk, ops.b_kn, out, scale_a=ops.scale_a, scale_b=ops.scale_b)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    verdict = compare(out, reference(ops), DType.BF16, fp8_inputs=True)
    assert verdict.status is Status.OK, verdict.reason
