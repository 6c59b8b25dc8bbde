"""Block-wise fp8 grouped problems on the CPU: operands stored as MoE code keeps them (A's
scales M x K/128 row-major, B's E x N/128 x K/128), the fp32 reference of the dequantized math
checked expert by expert, and torch's paths (dequantize + grouped GEMM, per-expert and dense
block-wise GEMMs) computing it."""

import pytest
import torch

from cutlass_tune.bench._targets import baseline_target, grouped_blockwise_paths, grouped_mm
from cutlass_tune.bench._verify import allocate, group_bounds, randomize, reference, verify_launch
from cutlass_tune.measurement import Baseline
from cutlass_tune.space import DType, Problem, Routing, RuntimeArgs, Scaling
from cutlass_tune.status import Status

FP8_BLOCKWISE = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, scaling=Scaling.BLOCKWISE)
# Expert 1 gets no rows and expert 2 one; N of one and a half scale blocks.
UNEVEN = Problem.experts(4, 192, 256, 40, routing=Routing.HISTOGRAM, group_rows=(25, 0, 1, 14), **FP8_BLOCKWISE)


def _ops(problem, seed=0):
    ops = allocate(problem, "cpu")
    randomize(ops, torch.Generator().manual_seed(seed))
    return ops


def test_scales_are_k_major_as_moe_code_keeps_them():
    ops = _ops(UNEVEN)
    assert ops.scale_a.shape == (40, 2) and ops.scale_a.is_contiguous()
    assert ops.scale_b.shape == (4, 2, 2) and ops.scale_b.is_contiguous()
    assert ops.scale_a.min() > 0 and ops.scale_b.min() > 0
    assert ops.a.dtype == ops.b.dtype == torch.float8_e4m3fn and ops.d.dtype == torch.bfloat16
    copy = ops.copy()
    assert copy.scale_a.stride() == ops.scale_a.stride() and torch.equal(copy.scale_b, ops.scale_b)


def test_the_reference_is_each_experts_dequantized_rows_times_its_dequantized_weight():
    ops = _ops(UNEVEN)
    ref = reference(ops)
    a = ops.a.float() * ops.scale_a.repeat_interleave(128, 1)
    for e, (lo, hi) in enumerate(group_bounds(UNEVEN)):
        w = ops.b[e].float() * ops.scale_b[e].repeat_interleave(128, 0)[:192].repeat_interleave(128, 1)
        torch.testing.assert_close(ref[lo:hi], a[lo:hi] @ w.t(), rtol=1e-5, atol=1e-5)


def test_a_kernel_reading_another_experts_weight_scales_fails_naming_the_expert():
    ops = _ops(UNEVEN)
    ref = reference(ops)
    wrong = ops.copy()
    wrong.scale_b[3] = ops.scale_b[0]  # what a builder indexing the scales by the wrong expert reads
    verdict = verify_launch(lambda: ops.d.copy_(reference(wrong)), ops, ref)
    assert verdict.status is Status.WRONG_RESULT and verdict.reason.startswith("expert 3 (rows 26:40)")
    assert verify_launch(lambda: ops.d.copy_(ref), ops, ref).status is Status.OK


@pytest.mark.skipif(grouped_mm() is None, reason="this torch has no grouped GEMM")
@pytest.mark.parametrize("kind", [Baseline.GROUPED_MM, Baseline.EXPERT_LOOP, Baseline.DENSE])
def test_torchs_paths_compute_the_dequantized_math(kind):
    ops = _ops(UNEVEN)
    ref = reference(ops)
    target = baseline_target(UNEVEN, kind)
    assert target.setup(RuntimeArgs(), ops) is None
    verdict = target.check(ops, ref)
    assert verdict.status is Status.OK, (kind, verdict.reason)


def test_the_baseline_row_names_torchs_paths():
    note = grouped_blockwise_paths(torch.device("cpu"), 1024)
    assert note.startswith("torch._grouped_mm is dequantize A and the weights to bf16 + torch's grouped GEMM")
    assert "the expert loop is" in note


def test_the_expert_loop_contends_on_a_blockwise_row_only():
    """Guards ratios against dequantize + torch._grouped_mm alone where torch's expert loop is faster."""
    from cutlass_tune.bench import Job

    row = Job.baseline(UNEVEN).measurement(RuntimeArgs(), Status.OK, median_ms=2.0, loop_median_ms=1.6,
                                           dense_median_ms=0.5)
    assert row.strongest() == (Baseline.EXPERT_LOOP, pytest.approx(1.25))  # the dense GEMM never contends
    assert row.to_strongest(1.5) == (Baseline.EXPERT_LOOP, pytest.approx(1.2))
    bf16 = Problem.experts(4, 192, 256, 40, routing=Routing.HISTOGRAM, group_rows=(25, 0, 1, 14))
    plain = Job.baseline(bf16).measurement(RuntimeArgs(), Status.OK, median_ms=2.0, loop_median_ms=1.6)
    assert plain.strongest() == (Baseline.GROUPED_MM, 1.0)
