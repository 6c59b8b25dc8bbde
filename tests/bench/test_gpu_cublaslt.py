"""On a Hopper GPU: cuBLASLt's own bias + activation epilogue (`torch._addmm_activation`) as the
third baseline of a fused problem: the GELU form it computes, and its figures on the eager row.

Run with `python3 -m pytest tests/bench/test_gpu_cublaslt.py -m gpu -s` on the GPU host (no nvcc).
"""

import dataclasses

import pytest
import torch

from cutlass_tune.bench import GpuRunner, Job, TimingOptions
from cutlass_tune.bench._verify import allocate, randomize, reference
from cutlass_tune.measurement import Baseline, TimingMethod
from cutlass_tune.space import Activation, Epilogue, Problem
from cutlass_tune.status import Status

pytestmark = [pytest.mark.gpu]

TANH = Problem(2048, 4096, 4096, epilogue=Epilogue(bias=True, activation=Activation.GELU_TANH))
RELU = Problem(2048, 4096, 4096, epilogue=Epilogue(bias=True, activation=Activation.RELU))


def test_cublaslt_gelu_is_the_tanh_form_on_cuda():
    # The tolerances cannot tell erf GELU from its tanh form (2e-4 apart); over 8M outputs their
    # systematic difference shows beside the rounding noise. (On the CPU the op computes erf.)
    ops = allocate(TANH, "cuda:0")
    randomize(ops, torch.Generator("cuda:0").manual_seed(0))
    out = torch._addmm_activation(ops.bias, ops.a_mk, ops.b_kn, use_gelu=True).float()
    erf_ops = dataclasses.replace(ops, problem=dataclasses.replace(TANH, epilogue=Epilogue(True, Activation.GELU)))
    to_tanh = torch.linalg.vector_norm(out - reference(ops)).item()
    to_erf = torch.linalg.vector_norm(out - reference(erf_ops)).item()
    print(f"\n_addmm_activation(use_gelu=True): error to tanh GELU {to_tanh:.4g}, to erf GELU {to_erf:.4g}")
    assert to_tanh < to_erf


@pytest.mark.parametrize("method", [TimingMethod.EVENTS, TimingMethod.SUSTAINED])
@pytest.mark.parametrize("problem", [TANH, RELU], ids=["bias+gelu_tanh", "bias+relu"])
def test_the_eager_row_carries_cublaslt_beside_torch_compile(problem, method):
    timing = TimingOptions(method=method, budget_ms=300 if method is TimingMethod.SUSTAINED else 30, warmup_ms=5)
    [base] = GpuRunner(0)(Job.baseline(problem, timing=timing))
    assert base.status is Status.OK and base.reason == "", base.reason
    assert base.compile_median_ms and base.lt_median_ms
    side, factor = base.strongest()
    print(f"\n{problem.name} {method.value}: eager {base.median_ms:.3f} ms, torch.compile "
          f"{base.compile_median_ms:.3f} ms, cuBLASLt {base.lt_median_ms:.3f} ms; strongest {side.value} "
          f"({factor:.3f}x eager)")
    # F.linear already fuses the bias: cuBLASLt saves eager's activation pass and is no slower.
    assert side is not Baseline.EAGER or factor == 1.0
    assert base.lt_median_ms <= base.median_ms * 1.02
