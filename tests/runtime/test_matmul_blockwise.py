"""matmul's block-wise fp8 scales (torch._scaled_mm's shapes and strides) and torch's path for them
where no kernel runs: _scaled_mm's block-wise GEMM, else dequantize + bf16 matmul (the CPU's)."""

import pytest
import torch

from cutlass_tune._torch import blockwise_scaled_mm, blockwise_scaled_mm_for
from cutlass_tune.bench._targets import blockwise_path, eager_function
from cutlass_tune.bench._verify import allocate, randomize, reference
from cutlass_tune.runtime._matmul import MatmulInputError, operation_of, torch_gemm
from cutlass_tune.space import DType, Epilogue, Problem, Scaling

P = Problem(64, 256, 512, dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16, scaling=Scaling.BLOCKWISE)


def _ops():
    ops = allocate(P, "cpu")
    randomize(ops, torch.Generator().manual_seed(0))
    return ops


def test_blockwise_scales_are_recognised_and_their_strides_checked():
    ops = _ops()
    assert operation_of(ops.a_mk, ops.b_kn, torch.bfloat16, scale_a=ops.scale_a,
                        scale_b=ops.scale_b) == (Epilogue(), Scaling.BLOCKWISE)
    with pytest.raises(MatmulInputError, match=r"scale_a with strides \(4, 1\) must have strides \(1, 64\)"):
        operation_of(ops.a_mk, ops.b_kn, torch.bfloat16, scale_a=ops.scale_a.contiguous(), scale_b=ops.scale_b)
    with pytest.raises(MatmulInputError, match="scale_b with strides"):
        operation_of(ops.a_mk, ops.b_kn, torch.bfloat16, scale_a=ops.scale_a, scale_b=ops.scale_b.contiguous())


def test_torchs_path_computes_the_dequantized_product():
    ops = _ops()
    ref = reference(ops)
    assert not blockwise_scaled_mm(torch.device("cpu"))  # the CPU's _scaled_mm has no block-wise path
    assert "dequantize" in blockwise_path(torch.device("cpu"), 512)
    bias = torch.randn(256).to(torch.bfloat16)
    y = torch_gemm(ops.a_mk, ops.b_kn, torch.bfloat16, scale_a=ops.scale_a, scale_b=ops.scale_b, bias=bias)
    assert torch.linalg.vector_norm(y.float() - ref - bias.float()) / torch.linalg.vector_norm(ref) < 0.01
    eager = eager_function(P)(ops.a_mk, ops.b_kn, None, None, ops.scale_a, ops.scale_b)
    assert torch.linalg.vector_norm(eager.float() - ref) / torch.linalg.vector_norm(ref) < 0.01
    # Wrong scales are far off: the checks above can fail.
    wrong = torch_gemm(ops.a_mk, ops.b_kn, torch.bfloat16, scale_a=ops.scale_a, scale_b=ops.scale_b * 2)
    assert torch.linalg.vector_norm(wrong.float() - ref) / torch.linalg.vector_norm(ref) > 0.5


@pytest.mark.gpu
@pytest.mark.parametrize("k", [512, 640, 768, 1024, 1152])
def test_torchs_block_wise_path_is_right_for_every_k(k):
    """torch's path for block-wise fp8 (matmul's where no kernel runs, and the baselines'):
    torch 2.11's block-wise `_scaled_mm` returns wrong results, silently, where K/128 is not a
    multiple of 4; there the dequantized product computes instead."""
    problem = Problem(256, 2048, k, dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16,
                      scaling=Scaling.BLOCKWISE)
    ops = allocate(problem, "cuda")
    randomize(ops, torch.Generator(device="cuda").manual_seed(0))
    ref = reference(ops)
    got = torch_gemm(ops.a_mk, ops.b_kn, torch.bfloat16, scale_a=ops.scale_a, scale_b=ops.scale_b)
    assert (torch.linalg.vector_norm(got.float() - ref) / torch.linalg.vector_norm(ref)).item() < 1e-2
    assert blockwise_scaled_mm_for(ops.d.device, k) == (blockwise_scaled_mm(ops.d.device) and k // 128 % 4 == 0)
    assert ("dequantize" in blockwise_path(ops.d.device, k)) != blockwise_scaled_mm_for(ops.d.device, k)
    if blockwise_scaled_mm(ops.d.device):
        raw = torch._scaled_mm(ops.a_mk, ops.b_kn, ops.scale_a, ops.scale_b, out_dtype=torch.bfloat16)
        error = (torch.linalg.vector_norm(raw.float() - ref) / torch.linalg.vector_norm(ref)).item()
        used = "_scaled_mm" if blockwise_scaled_mm_for(ops.d.device, k) else "dequantized"
        print(f"\nK {k}: torch._scaled_mm block-wise relative error {error:.2e}; torch's path: {used}")
