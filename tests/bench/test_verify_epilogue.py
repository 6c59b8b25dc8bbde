"""Operands and fp32 reference of fused epilogues and scaled fp8, and the check after an activation."""

import dataclasses
import math

import pytest
import torch

from cutlass_tune._torch import ACTIVATION
from cutlass_tune.bench import compare
from cutlass_tune.bench._verify import ELEMENT_TOLERANCE, TOLERANCE, allocate, randomize, reference
from cutlass_tune.space import GLU_BLOCK, Activation, DType, Epilogue, Pair, Problem, Routing, Scaling
from cutlass_tune.status import Status

FULL = Epilogue(bias=True, activation=Activation.SILU, residual=True)


def _ops(problem, seed=0):
    ops = allocate(problem, "cpu")
    randomize(ops, torch.Generator().manual_seed(seed))
    return ops


def _fp8(scaling, epilogue=Epilogue(), m=64, n=48, k=128):
    return Problem(m, n, k, dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16, epilogue=epilogue,
                   scaling=scaling)


def test_a_plain_problem_has_no_epilogue_operands():
    ops = _ops(Problem(64, 48, 32))
    assert (ops.c, ops.bias, ops.scale_a, ops.scale_b) == (None, None, None, None)
    assert list(ops.inputs) == ["a", "b"]
    assert ops.nbytes == (64 * 32 + 48 * 32 + 64 * 48) * 2


def test_each_epilogue_operand_has_the_shape_and_type_the_kernel_reads():
    ops = _ops(_fp8(Scaling.ROWCOL, FULL))
    assert ops.c.shape == (64, 48) and ops.c.dtype == torch.bfloat16 and ops.c.is_contiguous()
    assert ops.bias.shape == (48,) and ops.bias.dtype == torch.bfloat16
    # As torch._scaled_mm takes row-wise scales: (M, 1) for A, (1, N) for B, fp32.
    assert ops.scale_a.shape == (64, 1) and ops.scale_b.shape == (1, 48)
    assert ops.scale_a.dtype == ops.scale_b.dtype == torch.float32
    assert ops.nbytes == 64 * 128 + 48 * 128 + 2 * 64 * 48 * 2 + 48 * 2 + (64 + 48) * 4
    tensor = _ops(_fp8(Scaling.TENSOR))
    assert tensor.scale_a.shape == tensor.scale_b.shape == () and tensor.c is None and tensor.bias is None


def test_a_copy_holds_the_same_inputs_in_new_storage():
    ops = _ops(_fp8(Scaling.ROWCOL, FULL))
    twin = ops.copy()
    for name, t in ops.inputs.items():
        other = getattr(twin, name)
        assert torch.equal(other.float(), t.float()) and other.data_ptr() != t.data_ptr(), name
    assert twin.d.data_ptr() != ops.d.data_ptr()


def test_scaled_fp8_operands_are_quantized_by_their_own_amax():
    ops = _ops(_fp8(Scaling.ROWCOL, m=256, n=128, k=512))
    limit = torch.finfo(torch.float8_e4m3fn).max
    # Each row of A (column of B) reaches the top of e4m3's range: its scale is its amax / 448.
    assert torch.equal(ops.a.float().abs().amax(dim=1), torch.full((256,), limit))
    assert torch.equal(ops.b.float().abs().amax(dim=1), torch.full((128,), limit))
    for scale in (ops.scale_a, ops.scale_b):
        assert (scale > 0).all() and 1.5 < scale.max() / scale.min() < 4.0 * 1.5  # spread of up to 2x either way
    # The scaled product is about unit scale again, as for 16-bit inputs.
    assert 0.5 < reference(ops).std().item() < 2.0
    tensor = _ops(_fp8(Scaling.TENSOR, m=256, n=128, k=512))
    assert tensor.a.float().abs().max() == limit and tensor.scale_a.item() > 0


def _gelu_erf(x):
    return 0.5 * x * (1 + math.erf(x / math.sqrt(2)))


def _gelu_tanh(x):
    return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


HAND = {
    Activation.NONE: lambda x: x,
    Activation.RELU: lambda x: max(x, 0.0),
    Activation.GELU: _gelu_erf,
    Activation.GELU_TANH: _gelu_tanh,
    Activation.SILU: lambda x: x / (1 + math.exp(-x)),
}


@pytest.mark.parametrize("activation", list(Activation))
@pytest.mark.parametrize("scaling", [Scaling.NONE, Scaling.TENSOR, Scaling.ROWCOL])
def test_the_reference_is_the_epilogue_formula(activation, scaling):
    epilogue = Epilogue(bias=True, activation=activation, residual=True)
    p = _fp8(scaling, epilogue) if scaling is not Scaling.NONE else Problem(64, 48, 32, epilogue=epilogue)
    ops = _ops(p, seed=3)
    a, b = ops.a_mk.float(), ops.b_kn.float()
    ref = reference(ops)
    for i, j in [(0, 0), (5, 7), (63, 47), (31, 20)]:
        acc = sum(a[i, k].item() * b[k, j].item() for k in range(p.k))
        if scaling is Scaling.TENSOR:
            acc *= ops.scale_a.item() * ops.scale_b.item()
        elif scaling is Scaling.ROWCOL:
            acc *= ops.scale_a[i, 0].item() * ops.scale_b[0, j].item()
        x = acc + ops.c[i, j].item() + ops.bias[j].item()
        assert ref[i, j].item() == pytest.approx(HAND[activation](x), rel=1e-4, abs=1e-5), (i, j)


def test_unscaled_fp8_bias_and_residual_have_the_accumulators_scale():
    # Guards against a bias that vanishes beside fp8 accumulators of size sqrt(K) (a kernel
    # dropping it would pass).
    ops = _ops(_fp8(Scaling.NONE, Epilogue(bias=True, residual=True), k=1024))
    assert 20 < ops.bias.float().std().item() < 45 and 25 < ops.c.float().std().item() < 40


BIG = Problem(1024, 512, 256, epilogue=Epilogue(bias=True))


@pytest.mark.parametrize("activation", [Activation.RELU, Activation.GELU, Activation.GELU_TANH, Activation.SILU])
def test_after_an_activation_a_right_output_stays_well_inside_the_tolerances(activation):
    # Why the plain GEMM's tolerances still hold: the activated output's RMS falls, its rounding does not grow.
    ops = _ops(BIG)
    pre = reference(ops)
    ref = ACTIVATION[activation](pre)
    verdict = compare(ref.to(torch.bfloat16), ref, DType.BF16)
    assert verdict.status is Status.OK and verdict.rel_error < TOLERANCE[DType.BF16] / 4
    assert verdict.worst_error < ELEMENT_TOLERANCE[DType.BF16] / 2
    # An accumulation error of bf16 size before the activation still passes after it.
    noisy = ACTIVATION[activation](pre + 2e-3 * torch.randn(pre.shape, generator=torch.Generator().manual_seed(1)))
    assert compare(noisy.to(torch.bfloat16), ref, DType.BF16).status is Status.OK


@pytest.mark.parametrize("wrong", [
    lambda pre, bias: torch.nn.functional.silu(pre - bias),  # the bias left out
    lambda pre, bias: torch.nn.functional.silu(pre + bias),  # added twice
    lambda pre, bias: torch.nn.functional.gelu(pre),  # the wrong activation
    lambda pre, bias: pre,  # none at all
])
def test_a_wrong_epilogue_fails(wrong):
    p = Problem(1024, 512, 256, epilogue=Epilogue(bias=True, activation=Activation.SILU))
    ops = _ops(p)
    ref = reference(ops)
    pre = torch.matmul(ops.a_mk.float(), ops.b_kn.float()) + ops.bias.float()
    verdict = compare(wrong(pre, ops.bias.float()).to(torch.bfloat16), ref, DType.BF16)
    assert verdict.status is Status.WRONG_RESULT


def test_a_wrong_row_scale_fails():
    ops = _ops(_fp8(Scaling.ROWCOL, Epilogue(bias=True, activation=Activation.GELU), m=2048, n=256, k=512))
    ref = reference(ops)
    ops.scale_a[7] *= 1.5  # one row of 2048 scaled wrong: under the Frobenius bound, not the element one
    verdict = compare(reference(ops).to(torch.bfloat16), ref, DType.BF16, fp8_inputs=True)
    assert verdict.status is Status.WRONG_RESULT and verdict.reason.startswith("element (7, ")


@pytest.mark.parametrize("activation", list(Activation))
@pytest.mark.parametrize("scaling", [Scaling.NONE, Scaling.ROWCOL])
def test_the_gated_reference_is_the_activated_gate_times_the_product(activation, scaling):
    epilogue = Epilogue(bias=True, activation=activation, gated=True)
    p = _fp8(scaling, epilogue) if scaling is not Scaling.NONE else Problem(64, 48, 32, epilogue=epilogue)
    ops = _ops(p, seed=4)
    # C is the gate's pre-activation, M x N of D's type and D's scale, as a residual is.
    assert ops.c.shape == (64, 48) and ops.c.dtype == torch.bfloat16 and 0.5 < ops.c.float().std() < 2
    a, b = ops.a_mk.float(), ops.b_kn.float()
    ref = reference(ops)
    for i, j in [(0, 0), (5, 7), (63, 47)]:
        acc = sum(a[i, k].item() * b[k, j].item() for k in range(p.k))
        if scaling is Scaling.ROWCOL:
            acc *= ops.scale_a[i, 0].item() * ops.scale_b[0, j].item()
        expected = HAND[activation](ops.c[i, j].item()) * (acc + ops.bias[j].item())
        assert ref[i, j].item() == pytest.approx(expected, rel=1e-4, abs=1e-5), (i, j)


@pytest.mark.parametrize("wrong", [
    lambda up, gate: up,  # the gate dropped
    lambda up, gate: torch.nn.functional.silu(up * gate),  # the activation of the product, not of C
    lambda up, gate: gate * torch.nn.functional.silu(up),  # the activation on the wrong operand
    lambda up, gate: torch.nn.functional.silu(up + gate),  # C added as a residual
])
def test_a_wrong_gated_epilogue_fails(wrong):
    p = Problem(1024, 512, 256, epilogue=Epilogue(bias=True, activation=Activation.SILU, gated=True))
    ops = _ops(p)
    ref = reference(ops)
    assert compare(ref.to(torch.bfloat16), ref, DType.BF16).status is Status.OK
    up = torch.matmul(ops.a_mk.float(), ops.b_kn.float()) + ops.bias.float()
    verdict = compare(wrong(up, ops.c.float()).to(torch.bfloat16), ref, DType.BF16)
    assert verdict.status is Status.WRONG_RESULT


@pytest.mark.parametrize("activation", [a for a in Activation if a is not Activation.NONE])
def test_a_fused_grouped_reference_is_the_activation_of_each_expert_s_product(activation):
    rows = (40, 0, 17, 7)
    fused = Problem.experts(len(rows), 64, 32, sum(rows), routing=Routing.HISTOGRAM, group_rows=rows,
                            epilogue=Epilogue(activation=activation))
    ops = allocate(fused, "cpu")
    randomize(ops, torch.Generator().manual_seed(0))
    plain = dataclasses.replace(ops, problem=dataclasses.replace(fused, epilogue=Epilogue()))
    torch.testing.assert_close(reference(ops), ACTIVATION[activation](reference(plain)), rtol=0, atol=0)
    # The plain product fails against it (the activation is not a no-op within the tolerances).
    assert compare(reference(plain), reference(ops), DType.BF16).status is Status.WRONG_RESULT


@pytest.mark.parametrize("pair", [Pair.INTERLEAVED, Pair.SPLIT])
def test_the_declared_glu_pair_gives_d_half_the_columns(pair):
    """The bench reads D's shape and the operands from the epilogue: ready for the MoE layer's
    gate_up GEMM before a kernel renders it."""
    m, n = 24, 64
    problem = Problem(m, n, 32, epilogue=Epilogue(activation=Activation.SILU, pair=pair, row_scale=True))
    ops = allocate(problem, "cpu")
    assert ops.d.shape == (m, n // 2) and ops.c is None and ops.bias is None and ops.row_scale.shape == (m,)
    randomize(ops, torch.Generator().manual_seed(0))
    product = ops.a_mk.float() @ ops.b_kn.float()
    gate, up = (product[:, : n // 2], product[:, n // 2:]) if pair is Pair.SPLIT else (
        product.reshape(m, -1, 2, GLU_BLOCK)[:, :, 0].reshape(m, -1), product.reshape(m, -1, 2, GLU_BLOCK)[:, :, 1]
        .reshape(m, -1))
    torch.testing.assert_close(reference(ops), torch.nn.functional.silu(gate) * up * ops.row_scale[:, None])
