"""`grouped_mm`'s block-wise fp8 arguments on the CPU: the scales it takes (A's M x K/128
row-major, B's E x N/128 x K/128 or its transpose view) and one-line errors for the rest, and
torch's path (dequantize + torch's grouped GEMM) against the fp32 reference. The tuned kernels
run in test_grouped_fp8_gpu.py."""

import pytest
import torch

from cutlass_tune.runtime import MatmulInputError
from cutlass_tune.runtime._grouped import grouped_scales, torch_blockwise_grouped_mm

E, N, K = 4, 256, 384
OFFS = (5, 5, 6, 24)  # expert 1 gets no rows, expert 2 one
M = OFFS[-1]
FP8 = torch.float8_e4m3fn


def operands():
    torch.manual_seed(0)
    a = torch.randn(M, K).to(FP8)
    w = torch.randn(E, N, K).to(FP8)
    scale_a = torch.rand(M, K // 128) + 0.5
    scale_w = torch.rand(E, N // 128, K // 128) + 0.5
    return a, w, scale_a, scale_w, torch.tensor(OFFS, dtype=torch.int32)


def test_scales_in_either_form_give_the_weight_major_scales():
    a, w, scale_a, scale_w, _ = operands()
    b = w.transpose(-2, -1)
    for given in (scale_w, scale_w.transpose(-2, -1)):
        got_a, got_b = grouped_scales(a, b, scale_a, given)
        assert got_a is scale_a
        assert got_b.shape == (E, N // 128, K // 128) and got_b.is_contiguous()
        assert got_b.data_ptr() == scale_w.data_ptr()  # a view: nothing copied
    assert grouped_scales(a.bfloat16(), b.bfloat16(), None, None) is None


@pytest.mark.parametrize(("change", "message"), [
    (lambda a, sa, sb: (a, sa, None), "needs block-wise scale_a"),
    (lambda a, sa, sb: (a.bfloat16(), sa, sb), "scale float8_e4m3fn inputs; a and b are torch.bfloat16"),
    (lambda a, sa, sb: (a, sa.half(), sb), "scale_a has dtype torch.float16"),
    (lambda a, sa, sb: (a, sa.double(), sb), "scale_a has dtype torch.float64"),
    (lambda a, sa, sb: (a, sa[:, :2], sb), r"scale_a has shape \(24, 2\); block-wise it must be \(24, 3\)"),
    (lambda a, sa, sb: (a, sa.t().contiguous().t(), sb), "must be row-major"),
    (lambda a, sa, sb: (a, sa, sb[:, :1]), "scale_b has shape"),
    (lambda a, sa, sb: (a, sa, sb.float().half()), "scale_b has dtype torch.float16"),
    (lambda a, sa, sb: (a, sa, sb.permute(0, 2, 1).contiguous()), "it must be the experts' weight scales"),
    (lambda a, sa, sb: (a, sa, "1.0"), "scale_b must be a torch.Tensor"),
])
def test_bad_scales_are_one_line_errors(change, message):
    a, w, scale_a, scale_w, _ = operands()
    a, scale_a, scale_w = change(a, scale_a, scale_w)
    b = w.transpose(-2, -1) if a.dtype == FP8 else w.transpose(-2, -1).bfloat16()
    with pytest.raises(MatmulInputError, match=message) as err:
        grouped_scales(a, b, scale_a, scale_w)
    assert "\n" not in str(err.value)


def test_torch_path_is_the_dequantized_math_for_every_expert():
    a, w, scale_a, scale_w, offs = operands()
    out = torch_blockwise_grouped_mm(a, w.transpose(-2, -1), offs, scale_a, scale_w)
    assert out.dtype == torch.bfloat16 and out.shape == (M, N)
    a32 = a.float() * scale_a.repeat_interleave(128, 1)
    w32 = w.float() * scale_w.repeat_interleave(128, 1).repeat_interleave(128, 2)
    ref = torch.cat([a32[start:end] @ w32[e].t() for e, (start, end) in enumerate(zip((0, *OFFS), OFFS))])
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
