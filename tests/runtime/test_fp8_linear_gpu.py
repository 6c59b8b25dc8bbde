"""cutlass_tune.nn.Fp8Linear on a Hopper GPU against torch._scaled_mm on the same quantized operands.

The committed tables (results/) hold no fp8 rows, so the torch path runs with a bf16-only table;
the tuned path runs hand-made tables of one fp8 kernel per scaling (compiled on first use: nvcc).
Run: python3 -m pytest tests/runtime/test_fp8_linear_gpu.py -q -rs
"""

import json
import warnings

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from cutlass_tune._torch import blockwise_mm
from cutlass_tune.nn import Fp8Linear
from cutlass_tune.runtime import BestTable
from cutlass_tune.runtime._fp8 import quantize_blockwise_activations, quantize_rowwise
from cutlass_tune.runtime._fp8_linear import BLOCKWISE_ROWS
from cutlass_tune.space import DType, Epilogue, KernelConfig, Scaling

from .tables import csv_table

pytestmark = pytest.mark.gpu

K, N = 1024, 2048
KERNELS = {"rowwise": KernelConfig(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128, scaling=Scaling.ROWCOL,
                                   epilogue=Epilogue(bias=True)),
           "blockwise": KernelConfig(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128, scaling=Scaling.BLOCKWISE,
                                     epilogue=Epilogue(bias=True))}


def _kernel_table(cfg: KernelConfig) -> BestTable:
    # gpu "": a row naming no GPU serves every GPU model (BestTable.for_gpu).
    row = dict(gpu="", problem=f"1024x{N}x{K}_e4m3_bias_{cfg.scaling.value}", m=1024, n=N, k=K, dtype_a="e4m3",
               dtype_b="e4m3", dtype_d="bf16", layout="tn", kernel=cfg.name, config_hash=cfg.hash,
               config=json.dumps(cfg.to_dict(), sort_keys=True), raster="along_n", swizzle=1, splits=1,
               decomposition="heuristic", epilogue=cfg.epilogue.name, scaling=cfg.scaling.value,
               ratio=1.0)  # torch's speed: matmul's min_ratio 1.0 runs the kernel
    return BestTable(pd.DataFrame([row]))


def _module(table, scaling):
    torch.manual_seed(0)
    linear = torch.nn.Linear(K, N, dtype=torch.bfloat16)
    # Quantized on the CPU and moved: .cuda() keeps the block-wise scale's transposed strides.
    module = Fp8Linear.from_linear(linear, table, scaling=scaling).cuda()
    assert module.weight_scale.stride() == ((N, 1) if scaling == "rowwise" else (1, K // 128))
    return module


def _scaled_mm(module, x):
    """torch's GEMM of the same quantized operands Fp8Linear forms: torch._scaled_mm row-wise,
    its block-wise path (or the dequantized product where this torch has none) block-wise."""
    flat = x.reshape(-1, K)
    tokens = flat.shape[0]
    if module.scaling is Scaling.ROWCOL:
        xq, sa = quantize_rowwise(flat)
        y = torch._scaled_mm(xq, module.weight.t(), sa, module.weight_scale, bias=module.bias,
                             out_dtype=torch.bfloat16)
    else:  # Fp8Linear pads the tokens to a multiple of 4 (BLOCKWISE_ROWS): the same GEMM shape here
        xq, sa = quantize_blockwise_activations(F.pad(flat, (0, 0, 0, -tokens % BLOCKWISE_ROWS)))
        y = blockwise_mm(xq, module.weight.t(), sa, module.weight_scale, torch.bfloat16, module.bias)
    return y[:tokens].reshape(*x.shape[:-1], N)


def _x(tokens):
    return torch.randn(2, tokens, K, device="cuda", dtype=torch.bfloat16)


@pytest.mark.parametrize("scaling", ["rowwise", "blockwise"])
def test_without_fp8_rows_it_is_torch_s_scaled_gemm(tmp_path, scaling):
    table = csv_table(tmp_path / "bf16.csv", [("bf16", "tn", 1024, N, K)])
    module = _module(table, scaling)
    for tokens in (512, 5):  # 10 tokens: block-wise pads them to 12
        x = _x(tokens)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # matmul's one warning that the table has no fp8 rows
            got = module(x)
        assert got.shape == (2, tokens, N) and got.dtype == torch.bfloat16
        assert torch.equal(got, _scaled_mm(module, x))


@pytest.mark.nvcc
@pytest.mark.parametrize("scaling", ["rowwise", "blockwise"])
def test_the_tuned_kernel_matches_torch_on_the_same_operands(scaling):
    module = _module(_kernel_table(KERNELS[scaling]), scaling)
    for tokens in (512, 5):
        x = _x(tokens)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = module(x)
        assert not [w for w in caught if "cutlass_tune" in str(w.message)], [str(w.message) for w in caught]
        want = _scaled_mm(module, x)
        assert got.shape == want.shape and got.dtype == torch.bfloat16 and torch.isfinite(got).all()
        if scaling == "rowwise":  # the same fp32 math: apart by the bf16 rounding of the result
            torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-3 * want.abs().max().item())
        else:  # torch's block-wise path may be the dequantized bf16 product: compare by norm
            assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 1e-2


@pytest.mark.parametrize("scaling", ["rowwise", "blockwise"])
def test_under_torch_compile_the_tuned_gemm_is_an_operator_with_no_graph_break(scaling):
    """Compiled whole (fullgraph: a graph break raises), the module's output is its eager one:
    the quantization compiled around the operator, the tuned kernel inside it."""
    module = _module(_kernel_table(KERNELS[scaling]), scaling)
    x = _x(512)
    compiled = torch.compile(module, fullgraph=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = compiled(x)
    assert not [w for w in caught if "cutlass_tune" in str(w.message)], [str(w.message) for w in caught]
    want = module(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 1e-2
