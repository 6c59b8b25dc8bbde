"""On a Hopper GPU: block-wise fp8 kernels (A per 1x128 group, B per 128x128 block) against the
fp32 reference of the dequantized math and torch._scaled_mm's block-wise path, and the eager
baseline row naming the torch path it timed.

Run with `python3 -m pytest tests/bench/test_gpu_blockwise.py -m gpu -s` on the GPU host (nvcc
builds the two kernels into the kernel cache first, about a minute).
"""

import pytest
import torch

from cutlass_tune._torch import blockwise_scaled_mm_for
from cutlass_tune.bench import GpuRunner, Job, TimingOptions, compare
from cutlass_tune.bench._verify import allocate, randomize, reference
from cutlass_tune.compile import compile_kernels
from cutlass_tune.kernel import LoadedKernel, make_args
from cutlass_tune.space import DType, EpilogueSchedule, KernelConfig, KernelSchedule, Problem, RuntimeArgs, Scaling
from cutlass_tune.status import Status

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

BW = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_c=DType.BF16, dtype_d=DType.BF16, tile_k=128,
          scaling=Scaling.BLOCKWISE)
COOPERATIVE = KernelConfig(**BW)
PINGPONG = KernelConfig(**BW, tile_m=64, kernel_schedule=KernelSchedule.PINGPONG,
                        epilogue_schedule=EpilogueSchedule.TMA)
PROBLEMS = [Problem(m, 7168, 2048, dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16,
                    scaling=Scaling.BLOCKWISE) for m in (64, 4096)]


@pytest.fixture(scope="module")
def kernels():
    results = compile_kernels([COOPERATIVE, PINGPONG])
    for r in results:
        assert r.status is Status.OK, f"{r.config.name}: {r.reason} (log {r.log_path})"
    return results


def _launch(compiled, problem):
    kernel = LoadedKernel(compiled.library, compiled.symbol)
    ops = allocate(problem, "cuda:0")
    randomize(ops, torch.Generator("cuda:0").manual_seed(0))
    args = make_args(problem, RuntimeArgs(), a=ops.a.data_ptr(), b=ops.b.data_ptr(), d=ops.d.data_ptr(),
                     scale_a=ops.scale_a.data_ptr(), scale_b=ops.scale_b.data_ptr(), device_id=0,
                     sm_count=torch.cuda.get_device_properties(0).multi_processor_count)
    assert kernel.can_implement(args) == 0
    stream = torch.cuda.current_stream().cuda_stream
    ops.d.fill_(float("nan"))
    with kernel.create() as gemm:
        gemm.initialize(args, None, stream)
        gemm.run(stream)
        torch.cuda.synchronize()
    return ops


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: f"m{p.m}")
@pytest.mark.parametrize("which", [0, 1], ids=["cooperative", "pingpong"])
def test_blockwise_kernel_matches_the_reference_and_scaled_mm(kernels, which, problem):
    ops = _launch(kernels[which], problem)
    ref = reference(ops)
    verdict = compare(ops.d, ref, DType.BF16, fp8_inputs=True)
    line = f"\n{kernels[which].config.name} {problem.name}: rel error {verdict.rel_error}"
    if blockwise_scaled_mm_for(ops.d.device, problem.k):
        scaled = torch._scaled_mm(ops.a_mk, ops.b_kn, ops.scale_a, ops.scale_b, out_dtype=torch.bfloat16)
        between = (torch.linalg.vector_norm(ops.d.float() - scaled.float()) / torch.linalg.vector_norm(ref)).item()
        line += f", to torch._scaled_mm {between:.2e}"
        assert compare(scaled, ref, DType.BF16, fp8_inputs=True).status is Status.OK
    print(line)
    assert verdict.status is Status.OK, verdict.reason


def test_the_eager_row_names_its_torch_path_and_the_kernel_is_paired_with_it(kernels):
    problem, timing = PROBLEMS[0], TimingOptions(budget_ms=30, warmup_ms=5)
    runner = GpuRunner(0)
    [base] = runner(Job.baseline(problem, timing=timing))
    assert base.status is Status.OK, base.reason
    path = "torch._scaled_mm block-wise" if blockwise_scaled_mm_for(torch.device("cuda:0"), problem.k) else "dequantize"
    assert path in base.reason or base.reason.startswith("unstable"), base.reason
    [row] = runner(Job.for_kernel(kernels[0], problem, [RuntimeArgs()], timing=timing))
    assert row.status is Status.OK, row.reason
    print(f"\n{problem.name}: torch eager ({path}) {base.median_ms:.4f} ms, kernel {row.median_ms:.4f} ms, "
          f"paired ratio {row.paired_ratio}")
