"""cutlass_tune.nn.Fp8Linear on the CPU: quantization into torch._scaled_mm's scale layouts, the
result against nn.Linear and against the dequantized math, state_dict, one-line errors."""

import io

import pytest
import torch

from cutlass_tune.nn import Fp8Linear
from cutlass_tune.runtime import MatmulInputError
from cutlass_tune.runtime._fp8 import (
    E4M3_MAX,
    quantize_blockwise_activations,
    quantize_blockwise_weight,
    quantize_rowwise,
)
from cutlass_tune.runtime._matmul import operation_of
from cutlass_tune.space import Epilogue, Scaling

from .tables import csv_table

SCALINGS = ["rowwise", "blockwise"]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return csv_table(tmp_path_factory.mktemp("fp8-linear") / "best.csv", [("bf16", "tn", 128, 64, 32)])


def _linear(k=256, n=384, dtype=torch.bfloat16):
    torch.manual_seed(0)
    return torch.nn.Linear(k, n, dtype=dtype)


def _x(shape=(2, 5, 256), dtype=torch.bfloat16):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(dtype)


def _rel(got, want):
    return (torch.linalg.vector_norm(got.float() - want.float()) / torch.linalg.vector_norm(want.float())).item()


def _expand(scale, rows, cols):
    """A per-block scale grid repeated over the rows x cols it covers."""
    return scale.repeat_interleave(rows // scale.shape[0], 0).repeat_interleave(cols // scale.shape[1], 1)


@pytest.mark.parametrize("scaling", SCALINGS)
def test_the_output_is_nn_linear_s_within_fp8_error_and_exactly_the_dequantized_math(table, scaling):
    linear = _linear()
    module = Fp8Linear.from_linear(linear, table, scaling=scaling)
    x = _x()
    y = module(x)
    assert y.shape == (2, 5, 384) and y.dtype == torch.bfloat16
    # e4m3 keeps 3 mantissa bits: each operand rounds by up to 2^-4 relative (~3.6% rms).
    assert _rel(y, linear(x)) < 5e-2
    # The same quantized operands dequantized in float32: only the bf16 result's rounding apart.
    flat = x.reshape(10, 256)
    if scaling == "rowwise":
        xq, sa = quantize_rowwise(flat)
        w = module.weight.float() * module.weight_scale.t()
    else:
        xq, sa = quantize_blockwise_activations(flat)
        w = module.weight.float() * _expand(module.weight_scale.t(), 384, 256)
    want = (xq.float() * _expand(sa, 10, 256)) @ w.t() + module.bias.float()
    assert _rel(y.reshape(10, 384), want) < 1e-2


@pytest.mark.parametrize("scaling", SCALINGS)
def test_wrong_weight_scales_are_far_off(table, scaling):
    # Guards the tolerance above: a factor-2 error in the scales must fail it.
    linear = _linear()
    module = Fp8Linear.from_linear(linear, table, scaling=scaling)
    module.weight_scale.mul_(2)
    assert _rel(module(_x()), linear(_x())) > 0.5


def test_the_quantizers_give_torch_scaled_mm_s_scale_layouts():
    x, w = _x((10, 256)), _linear().weight.detach()
    xq, sa = quantize_rowwise(x)
    assert xq.dtype == torch.float8_e4m3fn and sa.shape == (10, 1) and sa.dtype == torch.float32
    xb, sab = quantize_blockwise_activations(x)
    assert sab.shape == (10, 2) and sab.stride() == (1, 10)  # the (K/128, M) contiguous tensor, transposed
    wb, sbb = quantize_blockwise_weight(w)
    assert wb.shape == (384, 256) and sbb.shape == (2, 3) and sbb.stride() == (1, 2)  # (K/128, N/128)
    assert operation_of(xb, wb.t(), torch.bfloat16, scale_a=sab, scale_b=sbb) == (Epilogue(), Scaling.BLOCKWISE)
    for q, scale, covered in ((xq, sa, (1, 256)), (xb, sab, (1, 128)), (wb, sbb.t(), (128, 128))):
        # Each group's largest value maps to 448, and q * scale gives the values back within e4m3's rounding.
        groups = q.float().abs().reshape(q.shape[0] // covered[0], covered[0], q.shape[1] // covered[1], covered[1])
        assert torch.equal(groups.amax(dim=(1, 3)), torch.full_like(scale, E4M3_MAX))
    assert _rel(wb.float() * _expand(sbb.t(), 384, 256), w) < 3e-2


@pytest.mark.parametrize("scaling", SCALINGS)
def test_module_scales_are_what_matmul_takes(table, scaling):
    module = Fp8Linear.from_linear(_linear(), table, scaling=scaling)
    assert module.weight.dtype == torch.float8_e4m3fn and module.weight.shape == (384, 256)
    assert not module.weight.requires_grad and not module.bias.requires_grad
    if scaling == "rowwise":
        assert module.weight_scale.shape == (1, 384) and module.weight_scale.is_contiguous()
        xq, sa = quantize_rowwise(_x((10, 256)))
        want = Scaling.ROWCOL
    else:
        assert module.weight_scale.shape == (2, 3) and module.weight_scale.stride() == (1, 2)
        xq, sa = quantize_blockwise_activations(_x((12, 256)))
        want = Scaling.BLOCKWISE
    got = operation_of(xq, module.weight.t(), torch.bfloat16, bias=module.bias, scale_a=sa,
                       scale_b=module.weight_scale)
    assert got == (Epilogue(bias=True), want)


@pytest.mark.parametrize("scaling", SCALINGS)
def test_state_dict_round_trips_into_a_fresh_module(table, scaling):
    module = Fp8Linear.from_linear(_linear(), table, scaling=scaling)
    assert list(module.state_dict()) == ["weight", "bias", "weight_scale"]
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    fresh = Fp8Linear(256, 384, table=table, scaling=scaling)
    fresh.load_state_dict(torch.load(buffer))
    assert fresh.weight_scale.stride() == module.weight_scale.stride()
    x = _x()
    assert torch.equal(fresh(x), module(x))
    assert list(Fp8Linear(256, 384, bias=False, table=table).state_dict()) == ["weight", "weight_scale"]


def test_an_fp16_linear_gives_fp16_and_out_dtype_is_taken(table):
    linear = _linear(dtype=torch.float16)
    x = _x(dtype=torch.float16)
    assert Fp8Linear.from_linear(linear, table)(x).dtype == torch.float16
    module = Fp8Linear.from_linear(linear, table, out_dtype=torch.float32)
    assert module.bias.dtype == torch.float32 and module(x).dtype == torch.float32


@pytest.mark.parametrize("scaling", SCALINGS)
def test_zero_tokens_give_the_bias_not_nan(table, scaling):
    # Regression guard: a zero row's amax is 0, and 0 / 0 would quantize it to NaN.
    x = _x()
    x[0, 1] = 0
    x[1] = 0
    module = Fp8Linear.from_linear(_linear(), table, scaling=scaling)
    y = module(x)
    assert torch.isfinite(y).all()
    assert torch.equal(y[1], module.bias.expand(5, 384)) and torch.equal(y[0, 1], module.bias)
    plain = Fp8Linear.from_linear(torch.nn.Linear(256, 384, bias=False, dtype=torch.bfloat16), table,
                                  scaling=scaling)
    assert torch.equal(plain(torch.zeros(3, 256, dtype=torch.bfloat16)), torch.zeros(3, 384, dtype=torch.bfloat16))


@pytest.mark.parametrize(("scaling", "k", "n", "message"), [
    ("rowwise", 200, 384, "Fp8Linear rowwise: in_features 200 is not a multiple of 16"),
    ("rowwise", 256, 100, "Fp8Linear rowwise: out_features 100 is not a multiple of 16"),
    ("blockwise", 192, 384, "Fp8Linear blockwise: in_features 192 is not a multiple of 128"),
    ("blockwise", 256, 320, "Fp8Linear blockwise: out_features 320 is not a multiple of 128"),
    ("per-tensor", 256, 384, "Fp8Linear scaling 'per-tensor' is not rowwise or blockwise"),
])
def test_bad_shapes_and_scalings_fail_at_from_linear_in_one_line(table, scaling, k, n, message):
    with pytest.raises(MatmulInputError, match=message) as caught:
        Fp8Linear.from_linear(torch.nn.Linear(k, n, dtype=torch.bfloat16), table, scaling=scaling)
    assert "\n" not in str(caught.value)


def test_an_input_of_other_features_names_the_shape(table):
    module = Fp8Linear.from_linear(_linear(), table)
    with pytest.raises(MatmulInputError, match=r"takes \[\.\.\., 256\], not \[2, 128\]"):
        module(torch.zeros(2, 128, dtype=torch.bfloat16))


def test_the_scaled_operator_compiles_with_no_graph_break_and_computes_torch_s_math(table):
    """`scaled_mm_op`, what Fp8Linear calls under torch.compile: traced whole (fullgraph), the
    table by its key; on the CPU torch's math (`torch_gemm`), bias included."""
    from cutlass_tune.runtime import register_table, torch_gemm
    from cutlass_tune.runtime._op import scaled_mm_op

    key = register_table(table, key="fp8-linear-op")
    torch.manual_seed(0)
    a, sa = quantize_rowwise(torch.randn(32, 64))
    w, sw = quantize_rowwise(torch.randn(48, 64))
    bias = torch.randn(48).to(torch.bfloat16)
    want = torch_gemm(a, w.t(), torch.bfloat16, bias=bias, scale_a=sa, scale_b=sw.reshape(1, -1))

    def fn(a, w, sa, sw, bias):
        return scaled_mm_op(a, w.t(), sa, sw.reshape(1, -1), bias, key, torch.bfloat16) * 2

    got = torch.compile(fn, fullgraph=True)(a, w, sa, sw, bias)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want * 2)
    with torch.device("meta"):  # the fake kernel: the shape and type, nothing computed
        out = scaled_mm_op(torch.empty(8, 64, dtype=a.dtype), torch.empty(64, 16, dtype=a.dtype),
                           torch.empty(8, 1), torch.empty(1, 16), None, key, torch.float16)
    assert (out.shape, out.dtype) == ((8, 16), torch.float16)


def test_the_scaled_operator_is_there_once_a_table_is_registered():
    """docs/api.md's compiled path: `register_table` alone (no Fp8Linear imported) defines the
    operators a compiled model calls, `scaled_mm` with `mm`."""
    import subprocess
    import sys

    code = ("import torch, pandas, cutlass_tune; "
            "cutlass_tune.register_table(cutlass_tune.BestTable(pandas.DataFrame())); "
            "print(hasattr(torch.ops.cutlass_tune, 'scaled_mm'), hasattr(torch.ops.cutlass_tune, 'mm'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "True"]
