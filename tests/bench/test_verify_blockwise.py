"""Block-wise fp8 operands (A per 1x128 group, B per 128x128 block), their scales' layouts and the
fp32 reference of the dequantized math; a kernel that skips or misplaces a scale fails."""

import pytest
import torch

from cutlass_tune._torch import expand_blockwise_scale_b
from cutlass_tune.bench import compare
from cutlass_tune.bench._verify import allocate, dequantized, randomize, reference
from cutlass_tune.space import DType, Problem, Scaling
from cutlass_tune.status import Status


def _ops(m=256, n=384, k=512, seed=0):
    p = Problem(m, n, k, dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16, scaling=Scaling.BLOCKWISE)
    ops = allocate(p, "cpu")
    randomize(ops, torch.Generator().manual_seed(seed))
    return ops


def test_blockwise_scales_have_torch_scaled_mms_shapes_and_strides():
    ops = _ops(m=64, n=320, k=384)
    # torch._scaled_mm on SM90: A's (M, K/128) outer-dim-major; B's (K/128, N/128) whose
    # transpose (the weight's N/128 x K/128) is contiguous. N 320 rounds up to 3 blocks.
    assert ops.scale_a.shape == (64, 3) and ops.scale_a.stride() == (1, 64)
    assert ops.scale_b.shape == (3, 3) and ops.scale_b.stride() == (1, 3)
    assert ops.scale_b.t().is_contiguous()
    copied = ops.copy()
    assert copied.scale_a.stride() == (1, 64) and copied.scale_b.stride() == (1, 3)


def test_each_group_and_block_is_quantized_by_its_own_amax():
    ops = _ops()
    limit = torch.finfo(torch.float8_e4m3fn).max
    a = ops.a_mk.float().abs().view(256, 4, 128).amax(dim=2)  # per 1 x 128 group
    assert (a == limit).all()
    b = ops.b_kn.t().float().abs().view(3, 128, 4, 128).amax(dim=(1, 3))  # per 128 x 128 block of N x K
    assert (b == limit).all()
    # Groups' sizes differ (up to 2x either way), so their scales do too.
    for scale in (ops.scale_a, ops.scale_b):
        assert (scale > 0).all() and scale.max() / scale.min() > 2.0


def test_the_reference_is_the_dequantized_product():
    ops = _ops(seed=2)
    ref = reference(ops)
    a, b = ops.a_mk.float(), ops.b_kn.float()
    for i, j in [(0, 0), (5, 200), (255, 383), (130, 129)]:
        acc = sum(ops.scale_a[i, kb].item() * ops.scale_b[kb, j // 128].item()
                  * float(a[i, kb * 128:(kb + 1) * 128] @ b[kb * 128:(kb + 1) * 128, j]) for kb in range(4))
        assert ref[i, j].item() == pytest.approx(acc, rel=1e-4, abs=1e-5), (i, j)
    # About unit scale, as the kernel's output should be.
    assert 0.3 < float(ref.pow(2).mean().sqrt()) < 3.0


def _kernel_output(ops, scale_a, scale_b):
    """What a kernel reading `scale_a` and `scale_b` in place of the operands' would write (bf16)."""
    wrong = ops.copy()
    wrong.scale_a.copy_(scale_a)
    wrong.scale_b.copy_(scale_b)
    return torch.matmul(*dequantized(wrong)).to(torch.bfloat16)


def test_a_right_output_passes_and_a_misplaced_scale_fails():
    ops = _ops(seed=1)
    ref = reference(ops)
    right = compare(_kernel_output(ops, ops.scale_a, ops.scale_b), ref, DType.BF16, fp8_inputs=True)
    assert right.status is Status.OK, right.reason
    skipped = ops.scale_b.clone()
    skipped[2, 1] = skipped[1, 1]  # one 128 x 128 block of B takes its neighbour's scale
    assert compare(_kernel_output(ops, ops.scale_a, skipped), ref, DType.BF16,
                   fp8_inputs=True).status is Status.WRONG_RESULT
    group = ops.scale_a.clone()
    group[17, 3] = 1.0  # one 1 x 128 group of A left unscaled
    assert compare(_kernel_output(ops, group, ops.scale_b), ref, DType.BF16,
                   fp8_inputs=True).status is Status.WRONG_RESULT


def test_b_scales_read_transposed_fail():
    ops = _ops(m=128, n=512, k=512, seed=4)  # 4 x 4 blocks: the transpose has the same shape
    ref = reference(ops)
    transposed = ops.scale_b.t().clone()
    out = _kernel_output(ops, ops.scale_a, transposed)
    assert compare(out, ref, DType.BF16, fp8_inputs=True).status is Status.WRONG_RESULT


@pytest.mark.parametrize("scale_n", [64, 32])
def test_b_scales_expanded_along_n_give_the_same_operand(scale_n):
    """What a kernel of scale_n 64 or 32 reads (one scale per 128 x scale_n block of the weight)
    dequantizes B exactly as the 128 x 128 scales do, N 320 ending in half a block included."""
    ops = _ops(m=64, n=320, k=384, seed=5)
    expanded = expand_blockwise_scale_b(ops.scale_b, 320, scale_n)
    assert expanded.shape == (3, -(-320 // scale_n)) and expanded.stride() == (1, 3)
    per_element = expanded.t().repeat_interleave(scale_n, 0)[:320].repeat_interleave(128, 1)
    assert torch.equal(ops.b_kn.t().float() * per_element, dequantized(ops)[1].t())
    assert expand_blockwise_scale_b(ops.scale_b, 320, 128) is ops.scale_b
