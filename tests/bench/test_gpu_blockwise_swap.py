"""On a Hopper GPU: A/B-swapped block-wise fp8 kernels (`swap_ab`: D^T = W X^T, the weights' scale
blocks along the kernel's tile M, one token scale per column of its tile N) against the fp32
reference of the original math, through the bench (`GpuRunner`) and the runtime (`Gemm`), which
pass the caller's operands and scales as to any block-wise kernel (the weights' scales expanded
along N for scale_n 64); the same kernel given the two scale tensors exchanged fails, so the
checks can.

Run with `python3 -m pytest tests/bench/test_gpu_blockwise_swap.py -m gpu -s` on the GPU host
(nvcc builds the five kernels into the kernel cache first, two to three minutes).
"""

import dataclasses

import pytest
import torch

from cutlass_tune.bench import GpuRunner, Job, TimingOptions, compare
from cutlass_tune.bench._verify import allocate, randomize, reference
from cutlass_tune.compile import compile_kernels
from cutlass_tune.kernel import LoadedKernel, make_args
from cutlass_tune.runtime import Gemm
from cutlass_tune.space import (
    DType,
    Epilogue,
    EpilogueSchedule,
    KernelConfig,
    KernelSchedule,
    Problem,
    RuntimeArgs,
    Scaling,
)
from cutlass_tune.status import Status

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

SWAP = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_c=DType.BF16, dtype_d=DType.BF16, tile_k=128,
            scaling=Scaling.BLOCKWISE, swap_ab=True, epilogue_source=False)
PINGPONG = dict(SWAP, tile_m=64, scale_n=64, kernel_schedule=KernelSchedule.PINGPONG,
                epilogue_schedule=EpilogueSchedule.TMA)
COOPERATIVE = dict(SWAP, tile_m=128, scale_n=128)
SWAPPED = [KernelConfig(**PINGPONG, tile_n=16), KernelConfig(**PINGPONG, tile_n=32, cluster_m=2),
           KernelConfig(**COOPERATIVE, tile_n=16), KernelConfig(**COOPERATIVE, tile_n=64, cluster_m=2)]
BIAS = KernelConfig(**PINGPONG, tile_n=32, epilogue=Epilogue.parse("bias+silu"))
FP8 = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16, scaling=Scaling.BLOCKWISE)
# DeepSeek-V3's expert down at decode; a token count that ends inside a tile and an N that ends
# in half a 128-row weight block; M = N / 128, where the two scale tensors have one size.
PROBLEMS = [Problem(32, 7168, 2048, **FP8), Problem(20, 4160, 1024, **FP8)]
SAME_SIZE_SCALES = Problem(32, 4096, 1024, **FP8)


@pytest.fixture(scope="module")
def kernels():
    results = compile_kernels([*SWAPPED, BIAS])
    for r in results:
        assert r.status is Status.OK, f"{r.config.name}: {r.reason} (log {r.log_path})"
    return {r.config: r for r in results}


def _operands(problem):
    ops = allocate(problem, "cuda:0")
    randomize(ops, torch.Generator("cuda:0").manual_seed(0))
    return ops


def _bench(kernel, problem):
    [row] = GpuRunner(0)(Job.for_kernel(kernel, problem, [RuntimeArgs()],
                                        timing=TimingOptions(budget_ms=30, warmup_ms=5)))
    print(f"\n{kernel.config.name} {problem.name}: {row.status.value} {row.median_ms} ms rel {row.rel_error}")
    return row


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.name)
def test_the_bench_verifies_swapped_kernels_against_the_reference(kernels, problem):
    for config in SWAPPED:
        row = _bench(kernels[config], problem)
        assert row.status is Status.OK, (config.name, row.reason)


def test_a_swapped_kernels_bias_is_added_per_column_of_the_callers_d(kernels):
    problem = dataclasses.replace(PROBLEMS[0], epilogue=BIAS.epilogue)
    row = _bench(kernels[BIAS], problem)
    assert row.status is Status.OK, row.reason


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.name)
def test_the_runtime_runs_a_swapped_kernel_on_torchs_operands_and_scales(kernels, problem):
    ops = _operands(problem)
    ref = reference(ops)
    for config in SWAPPED:
        out = Gemm(config)(ops.a_mk, ops.b_kn, scale_a=ops.scale_a, scale_b=ops.scale_b)
        verdict = compare(out, ref, DType.BF16, fp8_inputs=True)
        assert verdict.status is Status.OK, (config.name, verdict.reason)


def _launch(compiled, problem, ops, scale_a, scale_b):
    kernel = LoadedKernel(compiled.library, compiled.symbol)
    args = make_args(problem, RuntimeArgs(), a=ops.a.data_ptr(), b=ops.b.data_ptr(), d=ops.d.data_ptr(),
                     scale_a=scale_a.data_ptr(), scale_b=scale_b.data_ptr(), device_id=0,
                     sm_count=torch.cuda.get_device_properties(0).multi_processor_count)
    stream = torch.cuda.current_stream().cuda_stream
    ops.d.fill_(float("nan"))
    with kernel.create() as gemm:
        gemm.initialize(args, None, stream)
        gemm.run(stream)
        torch.cuda.synchronize()
    return compare(ops.d, reference(ops), DType.BF16, fp8_inputs=True)


def test_a_swapped_kernel_given_the_scales_exchanged_is_wrong(kernels):
    """The swap is inside the kernel: a caller that exchanged the scales with the operands (as the
    kernel's A and B) would scale the tokens by the weights' scales. At M = N / 128 both tensors
    hold M x K/128 floats, so the exchanged launch reads nothing outside them."""
    compiled = kernels[SWAPPED[2]]  # cooperative 128x16 at scale_n 128: the weights' scales as torch gives them
    problem = SAME_SIZE_SCALES
    ops = _operands(problem)
    assert ops.scale_a.numel() == ops.scale_b.numel()
    assert _launch(compiled, problem, ops, ops.scale_a, ops.scale_b).status is Status.OK
    assert _launch(compiled, problem, ops, ops.scale_b, ops.scale_a).status is not Status.OK
