import pytest
import torch

from cutlass_tune.bench import compare, verify_launch
from cutlass_tune.bench._verify import (
    ELEMENT_TOLERANCE,
    FP8_TOLERANCE,
    TOLERANCE,
    allocate,
    element_tolerance,
    randomize,
    reference,
    tolerance,
)
from cutlass_tune.space import DType, Layout, Problem
from cutlass_tune.status import Status


def _problem(layout_a, layout_b, dtype_d=DType.BF16):
    return Problem(48, 40, 32, dtype_d=dtype_d, layout_a=layout_a, layout_b=layout_b)


@pytest.mark.parametrize("layout_a", list(Layout))
@pytest.mark.parametrize("layout_b", list(Layout))
def test_storage_follows_the_problem_layouts(layout_a, layout_b):
    p = _problem(layout_a, layout_b)
    ops = allocate(p, "cpu")
    randomize(ops, torch.Generator().manual_seed(0))
    # ROW A: M x K row-major; COL A: column-major M x K, i.e. K x M row-major.
    assert ops.a.shape == ((p.m, p.k) if layout_a is Layout.ROW else (p.k, p.m))
    # COL B: N x K row-major (nn.Linear weight); ROW B: K x N row-major.
    assert ops.b.shape == ((p.n, p.k) if layout_b is Layout.COL else (p.k, p.n))
    assert ops.a.is_contiguous() and ops.b.is_contiguous() and ops.d.shape == (p.m, p.n)
    a = ops.a.float() if layout_a is Layout.ROW else ops.a.float().t()
    b = ops.b.float().t() if layout_b is Layout.COL else ops.b.float()
    i, j = 5, 7
    expected = sum(a[i, k] * b[k, j] for k in range(p.k))
    assert reference(ops)[i, j].item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-5)


def test_inputs_are_random_and_outputs_about_unit_scale():
    p = Problem(256, 256, 4096)
    ops = allocate(p, "cpu")
    randomize(ops, torch.Generator().manual_seed(1))
    assert not torch.equal(ops.a[0], ops.a[1])
    assert 0.7 < reference(ops).std().item() < 1.3


def _ref_and_out(dtype_d):
    p = _problem(Layout.ROW, Layout.COL, dtype_d)
    ops = allocate(p, "cpu")
    randomize(ops, torch.Generator().manual_seed(2))
    ref = reference(ops)
    return ops, ref


@pytest.mark.parametrize("dtype_d", [DType.BF16, DType.F16, DType.F32])
def test_a_correct_output_rounded_to_its_type_passes(dtype_d):
    ops, ref = _ref_and_out(dtype_d)
    verdict = compare(ref.to(ops.d.dtype), ref, dtype_d)
    assert verdict.status is Status.OK and verdict.rel_error < TOLERANCE[dtype_d] / 2
    assert 0 <= verdict.worst_error < ELEMENT_TOLERANCE[dtype_d] / 2


BIG = torch.randn(4096, 4096, generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("dtype_d", [DType.BF16, DType.F16])
def test_rounding_millions_of_elements_stays_within_the_element_bound(dtype_d):
    out = BIG.to({DType.BF16: torch.bfloat16, DType.F16: torch.float16}[dtype_d])
    verdict = compare(out, BIG, dtype_d)
    assert verdict.status is Status.OK and verdict.worst_error < ELEMENT_TOLERANCE[dtype_d] / 3


def test_one_wrong_tile_fails_though_the_frobenius_error_passes():
    # Guards against a kernel whose one bad 32x32 block (a partial tile) hides in a 4096^2 average.
    out = BIG.to(torch.bfloat16)
    out[4064:, 1000:1032] += torch.randn(32, 32, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    verdict = compare(out, BIG, DType.BF16)
    assert verdict.rel_error < TOLERANCE[DType.BF16]
    assert verdict.status is Status.WRONG_RESULT and verdict.worst_error > ELEMENT_TOLERANCE[DType.BF16]
    row, col = map(int, verdict.reason.removeprefix("element (").split(")")[0].split(", "))
    assert 4064 <= row < 4096 and 1000 <= col < 1032, verdict.reason
    assert "of the reference's RMS, more than the 0.1 allowed for a bf16 output" in verdict.reason


def test_torchs_own_roundings_of_a_heavy_tailed_output_pass_and_a_wrong_large_element_fails():
    """A gated output (the product of two normal-like values: elements up to about 20 RMS) as torch's
    eager path rounds it three times to bf16 passes, though one large element moves by more than
    0.1 RMS (rounding's own share of its size is allowed); a large element 5% off still fails."""
    g = torch.Generator().manual_seed(9)
    gate, up = torch.randn(2048, 2048, generator=g), torch.randn(2048, 2048, generator=g) * 4
    ref = torch.nn.functional.silu(gate) * up
    eager = torch.nn.functional.silu(gate.to(torch.bfloat16)) * up.to(torch.bfloat16)
    raw = float((eager.float() - ref).abs().max() / (ref.norm() / ref.numel() ** 0.5))
    verdict = compare(eager, ref, DType.BF16)
    assert verdict.status is Status.OK and verdict.worst_error == pytest.approx(raw)
    flat = int(ref.abs().argmax())
    wrong = ref.clone().view(-1)
    wrong[flat] *= 1.05
    verdict = compare(wrong.view(ref.shape).to(torch.bfloat16), ref, DType.BF16)
    assert verdict.status is Status.WRONG_RESULT
    assert verdict.reason.startswith(f"element ({flat // 2048}, {flat % 2048}) is off by")
    assert verdict.reason.endswith("(beyond 4 roundings of its value)")


@pytest.mark.parametrize("wrong", [
    lambda ref: ref + 1,
    lambda ref: torch.zeros_like(ref),
    lambda ref: ref.t().contiguous().t() * 1.05,  # 5 % off
])
def test_wrong_outputs_fail(wrong):
    ops, ref = _ref_and_out(DType.BF16)
    verdict = compare(wrong(ref).to(torch.bfloat16), ref, DType.BF16)
    assert verdict.status is Status.WRONG_RESULT and "relative error" in verdict.reason


def test_nan_or_inf_in_the_output_fails():
    ops, ref = _ref_and_out(DType.BF16)
    out = ref.to(torch.bfloat16)
    out[3, 4] = float("inf")
    out[0, 0] = float("nan")
    verdict = compare(out, ref, DType.BF16)
    assert verdict.status is Status.WRONG_RESULT and verdict.reason.startswith("2 of")


def test_a_launch_that_writes_nothing_leaves_the_nan_poison():
    ops, ref = _ref_and_out(DType.BF16)
    ops.d.copy_(ref)  # a stale right answer from before must not pass
    verdict = verify_launch(lambda: None, ops, ref)
    assert verdict.status is Status.WRONG_RESULT and "NaN" in verdict.reason
    verdict = verify_launch(lambda: ops.d.copy_(ref), ops, ref)
    assert verdict.status is Status.OK


FP8_PROBLEM = Problem(64, 48, 256, dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16)


def test_fp8_operands_are_stored_as_fp8_and_the_reference_uses_their_values():
    ops = allocate(FP8_PROBLEM, "cpu")
    randomize(ops, torch.Generator().manual_seed(3))
    assert ops.a.dtype == ops.b.dtype == torch.float8_e4m3fn and ops.d.dtype == torch.bfloat16
    assert ops.a.shape == (64, 256) and ops.b.shape == (48, 256)  # tn: B stored N x K
    a, b = ops.a.float(), ops.b.float()
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    assert 0.8 < a.std().item() < 1.2 and not torch.equal(a[0], a[1])
    # The reference multiplies the fp8 values themselves: quantization is not counted as error.
    assert torch.equal(reference(ops), a @ b.t())


def test_fp8_values_are_clamped_into_range():
    ops = allocate(Problem(16, 16, 4096, dtype_a=DType.E5M2, dtype_b=DType.E4M3), "cpu")
    randomize(ops, torch.Generator().manual_seed(4))
    assert ops.a.dtype == torch.float8_e5m2 and ops.b.dtype == torch.float8_e4m3fn
    assert torch.isfinite(ops.a.float()).all() and torch.isfinite(ops.b.float()).all()


def test_fp8_inputs_get_the_looser_tolerance():
    assert tolerance(DType.BF16, fp8_inputs=True) == FP8_TOLERANCE == 2e-2
    assert tolerance(DType.BF16) == TOLERANCE[DType.BF16]
    assert element_tolerance(DType.F16, fp8_inputs=True) == 0.25 > element_tolerance(DType.BF16)
    ops = allocate(FP8_PROBLEM, "cpu")
    randomize(ops, torch.Generator().manual_seed(5))
    ref = reference(ops)
    noisy = ref * (1 + 0.012 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(6)))
    assert compare(noisy.to(torch.bfloat16), ref, DType.BF16).status is Status.WRONG_RESULT
    verdict = verify_launch(lambda: ops.d.copy_(noisy), ops, ref)
    assert verdict.status is Status.OK and 1e-2 < verdict.rel_error < FP8_TOLERANCE
    verdict = verify_launch(lambda: ops.d.copy_(ref * 1.05), ops, ref)
    assert verdict.status is Status.WRONG_RESULT and verdict.reason.endswith("bf16 output from fp8 inputs")
