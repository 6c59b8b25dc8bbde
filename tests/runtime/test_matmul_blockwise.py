"""matmul's block-wise fp8 scales (torch._scaled_mm's shapes and strides) and torch's path for them
where no kernel runs: _scaled_mm's block-wise GEMM, else dequantize + bf16 matmul (the CPU's)."""

import dataclasses

import pytest
import torch

from cutlass_tune._torch import blockwise_scaled_mm, blockwise_scaled_mm_for, expand_blockwise_scale_b
from cutlass_tune.bench._targets import blockwise_path, eager_function
from cutlass_tune.bench._verify import allocate, randomize, reference
from cutlass_tune.runtime import _matmul
from cutlass_tune.runtime._matmul import Gemm, MatmulInputError, operation_of, torch_gemm
from cutlass_tune.space import DType, Epilogue, EpilogueSchedule, KernelConfig, KernelSchedule, Problem, Scaling
from cutlass_tune.tables import BundledKernel

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


def _blockwise_error(m, k, n, scale_a, scale_b):
    a = torch.zeros(m, k).to(torch.float8_e4m3fn)
    b = torch.zeros(n, k).to(torch.float8_e4m3fn).t()
    with pytest.raises(MatmulInputError) as caught:
        operation_of(a, b, torch.bfloat16, scale_a=scale_a, scale_b=scale_b)
    return str(caught.value)


def test_block_wise_scale_errors_name_the_wrong_operand_in_block_wise_words():
    """Guards a wrong block-wise scale_b being reported as scale_a's row-wise shape."""
    m, k, n = 64, 512, 256
    scale_a = torch.ones(k // 128, m).t()
    said = _blockwise_error(m, k, n, scale_a, torch.ones(n // 128, k // 128))  # the weight's, not transposed
    assert said.startswith("scale_b has shape (2, 4); block-wise it must be (4, 2)") and "K" not in said.split(":")[0]
    said = _blockwise_error(m, k, n, torch.ones(m, 3), torch.ones(n // 128, k // 128).t())
    assert said.startswith("scale_a has shape (64, 3); block-wise it must be (64, 4)")
    assert "multiple of 128" not in said


def test_block_wise_scales_of_a_k_of_partial_groups_say_k_must_be_a_multiple_of_128():
    """Guards K = 200 with K // 128 groups being reported as a row-wise scale_b of the wrong shape."""
    said = _blockwise_error(64, 200, 256, torch.ones(1, 64).t(), torch.ones(2, 1).t())
    assert said.startswith("scale_a has shape (64, 1); block-wise it must be (64, 2)")
    assert said.endswith("K 200 is not a multiple of 128: block-wise scaling needs K a multiple of 128")


def test_row_wise_scales_keep_their_row_wise_words():
    said = _blockwise_error(64, 512, 256, torch.ones(64, 1), torch.ones(1, 257))
    assert said.startswith("scale_b has shape (1, 257); it must be (1, 256) (one value per column of b")


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


class _Instance:
    def __init__(self, log):
        self.log = log

    def initialize(self, args, workspace, stream):
        self.log.append(args.scale_b)

    def run(self, stream):
        pass

    def close(self):
        pass


class _Kernel:
    """Stands for `LoadedKernel`: records the scale_b address each initialize gets."""

    log: list = []

    def __init__(self, library, symbol):
        pass

    def create(self):
        return _Instance(self.log)

    def workspace_size(self, args):
        return 0


NARROW = KernelConfig.for_operation(P, tile_m=64, tile_n=64, tile_k=128, scale_n=64,
                                    kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA)


@pytest.fixture
def narrow_gemm(monkeypatch):
    _Kernel.log = []
    monkeypatch.setattr(_matmul, "LoadedKernel", _Kernel)
    monkeypatch.setattr(_matmul, "current_stream", lambda device: 7)
    monkeypatch.setattr(_matmul, "bind_primary_context", lambda device: None)
    monkeypatch.setattr(_matmul, "sm_count", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return Gemm(NARROW, bundled=BundledKernel("unused.so", "k0"))


def test_a_narrow_n_kernel_reads_the_expanded_b_scales_kept_per_scale_tensor(narrow_gemm):
    ops = _ops()
    expanded = narrow_gemm.kernel_scale_b(ops.scale_b, P.n)
    assert torch.equal(expanded, expand_blockwise_scale_b(ops.scale_b, P.n, 64))
    assert narrow_gemm.kernel_scale_b(ops.scale_b, P.n) is expanded  # a weight's: made once
    for _ in range(2):
        narrow_gemm.run(P, ops.a_mk, ops.b_kn, ops.d, scale_a=ops.scale_a, scale_b=ops.scale_b)
    assert _Kernel.log == [expanded.data_ptr()]  # the kernel reads the expansion, initialized once


def test_b_scales_written_in_place_are_expanded_again(narrow_gemm):
    """Guards the kept expansion against a weight's scales reloaded in place (stale scales)."""
    ops = _ops()
    first = narrow_gemm.kernel_scale_b(ops.scale_b, P.n)
    ops.scale_b.mul_(2.0)
    again = narrow_gemm.kernel_scale_b(ops.scale_b, P.n)
    assert again is not first and torch.equal(again, expand_blockwise_scale_b(ops.scale_b, P.n, 64))


def test_scales_without_a_version_counter_are_expanded_per_call(narrow_gemm):
    with torch.inference_mode():
        scale_b = _ops().scale_b.clone()
    assert narrow_gemm.kernel_scale_b(scale_b, P.n) is not narrow_gemm.kernel_scale_b(scale_b, P.n)


def test_a_kernel_of_128_column_scales_reads_them_as_given(monkeypatch):
    monkeypatch.setattr(_matmul, "LoadedKernel", _Kernel)
    gemm = Gemm(dataclasses.replace(NARROW, tile_n=128, scale_n=128), bundled=BundledKernel("unused.so", "k0"))
    scale_b = _ops().scale_b
    assert gemm.kernel_scale_b(scale_b, P.n) is scale_b


def test_a_graph_capture_reads_the_kept_expansion_and_keeps_none_it_makes(narrow_gemm, monkeypatch):
    """Guards against a copy kernel in every replay of a captured decode step, and against an
    expansion made in the graph's memory pool kept past the capture."""
    ops = _ops()
    before = narrow_gemm.kernel_scale_b(ops.scale_b, P.n)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert narrow_gemm.kernel_scale_b(ops.scale_b, P.n) is before
    other = _ops().scale_b.clone()
    captured = narrow_gemm.kernel_scale_b(other, P.n)
    assert narrow_gemm.kernel_scale_b(other, P.n) is not captured
