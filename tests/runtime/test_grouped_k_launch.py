"""The weight-gradient launch (`GroupedGemm.run_weight_grad`, `Grouping.GROUPED_K`) on the CPU, the
kernel library replaced at its ctypes boundary by test_grouped_launch.py's recorder: the arguments
it hands the kernel and the result it allocates, and the one-line errors of its input checks. The
kernels themselves run in tests/runtime/test_gpu_grouped_k.py."""

import itertools

import pytest
import torch

from cutlass_tune.runtime import _grouped, _matmul
from cutlass_tune.runtime._grouped import weight_grad_problem_of
from cutlass_tune.runtime._matmul import MatmulInputError
from cutlass_tune.space import DType, Grouping, KernelConfig, Layout, Problem
from cutlass_tune.tables import BundledKernel

from .test_grouped_launch import FakeKernel, Log

E, N, K, M = 4, 16, 32, 24
WGRAD = KernelConfig(grouping=Grouping.GROUPED_K, layout_a=Layout.COL, layout_b=Layout.ROW, epilogue_source=False)


@pytest.fixture
def gemm(monkeypatch):
    FakeKernel.log = Log()
    monkeypatch.setattr(_matmul, "LoadedKernel", FakeKernel)
    streams = itertools.repeat(7)
    monkeypatch.setattr(_grouped, "current_stream", lambda device: next(streams))
    monkeypatch.setattr(_grouped, "bind_primary_context", lambda device: None)
    monkeypatch.setattr(_grouped, "sm_count", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return _grouped.GroupedGemm(WGRAD, bundled=BundledKernel("unused.so", "k0"))


def test_a_weight_gradient_launch_hands_g_x_and_dw_and_allocates_e_by_n_by_k(gemm):
    problem = Problem.experts(E, N, K, M, dtype_a=DType.BF16, dtype_b=DType.BF16, dtype_d=DType.BF16,
                              **{f: getattr(WGRAD, f) for f in ("layout_a", "layout_b", "grouping")})
    g, x = torch.randn(M, N, dtype=torch.bfloat16), torch.randn(M, K, dtype=torch.bfloat16)
    offs = torch.tensor([6, 6, 20, 24], dtype=torch.int32)
    out = gemm.launch(gemm.prepare(problem, 0), g, x, offs)
    assert out.shape == (E, N, K) and out.dtype == torch.bfloat16
    [(_, _, args, _, _)] = FakeKernel.log.of("initialize")
    assert args == dict(a=g.data_ptr(), b=x.data_ptr(), c=out.data_ptr(), d=out.data_ptr(),
                        offsets=offs.data_ptr(), m=M, n=N, k=K, groups=E)


def _operands(m=M, n=N, k=K, experts=E, dtype=torch.bfloat16):
    return (torch.randn(m, n).to(dtype), torch.randn(m, k).to(dtype),
            torch.full((experts,), m, dtype=torch.int32))


@pytest.mark.parametrize(("change", "words"), [
    (lambda g, x, o: (g, x[:-1], o), "the same rows"),
    (lambda g, x, o: (g, x.half(), o), "both bfloat16"),
    (lambda g, x, o: (g, x, o.long()), "int32"),
    (lambda g, x, o: (g[:, :12], x, o), "multiples of 8"),
    (lambda g, x, o: (g, torch.randn(K, M).bfloat16().t(), o), "row-major"),
    (lambda g, x, o: (g, x, o), "CUDA device"),
])
def test_what_the_weight_gradient_cannot_take_is_one_line(change, words):
    with pytest.raises(MatmulInputError) as err:
        weight_grad_problem_of(*change(*_operands()))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_forward_kernel_refuses_the_weight_gradient(monkeypatch):
    monkeypatch.setattr(_matmul, "LoadedKernel", FakeKernel)
    forward = _grouped.GroupedGemm(KernelConfig(grouping=Grouping.GROUPED), bundled=BundledKernel("unused.so", "k0"))
    with pytest.raises(MatmulInputError, match="not a weight-gradient kernel"):
        forward.run_weight_grad(*_operands())
