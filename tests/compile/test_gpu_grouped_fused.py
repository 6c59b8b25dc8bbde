"""On a Hopper GPU: fused grouped kernels (an activation in the ptr-array epilogue) against the fp32
reference through the bench's own verification, with experts of no rows and sizes no tile
divides; their torch._grouped_mm baseline with the activation; and `cutlass_tune.grouped_mm`'s
`activation` through a tuned kernel and through torch's fallback.

Run on the GPU host (nvcc first builds the two kernels into the user's kernel cache, 1-2 minutes):
    python3 -m pytest tests/compile/test_gpu_grouped_fused.py -m gpu -s -p no:cacheprovider
"""

from __future__ import annotations

import json
import warnings

import pandas as pd
import pytest
import torch

import cutlass_tune
from cutlass_tune._torch import ACTIVATION
from cutlass_tune.bench import GpuRunner, Job, TimingOptions
from cutlass_tune.bench._targets import baseline_target
from cutlass_tune.bench._verify import allocate, randomize, reference
from cutlass_tune.compile import compile_kernels
from cutlass_tune.measurement import Baseline
from cutlass_tune.runtime import BestTable
from cutlass_tune.space import Activation, DType, Epilogue, Problem, Routing, RuntimeArgs
from cutlass_tune.status import Status
from cutlass_tune.tables import experts_cells

from .test_nvcc_grouped_fused import GROUPED_FUSED

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

N, K = 768, 512
ROWS = (0, 1, 37, 300, 0, 129, 1000, 0)
SHORT = TimingOptions(budget_ms=30, warmup_ms=5)


@pytest.fixture(scope="module")
def compiled():
    results = compile_kernels(GROUPED_FUSED)  # the user's kernel cache: a rerun finds them
    for r in results:
        assert r.status is Status.OK, f"{r.config.name}: {r.reason} (log {r.log_path})"
    return results


def _problem(cfg) -> Problem:
    return Problem.experts(len(ROWS), N, K, sum(ROWS), routing=Routing.HISTOGRAM, group_rows=ROWS,
                           **cfg.operation_fields())


@pytest.mark.parametrize("index", range(len(GROUPED_FUSED)))
def test_a_fused_grouped_kernel_is_verified_and_timed_against_its_baseline(compiled, index):
    kernel = compiled[index]
    problem = _problem(kernel.config)
    runner = GpuRunner(0)
    [m] = runner(Job.for_kernel(kernel, problem, (RuntimeArgs(),), timing=SHORT))
    assert m.status is Status.OK, m.reason  # the runner verified D against the fp32 reference first
    if problem.dtype_a is DType.F16:
        # torch 2.11's grouped GEMM of f16 synchronizes the host (torch.cuda.set_sync_debug_mode
        # raised on an H200), which the bench's timing refuses ("the host never got ahead of the
        # GPU"): the baseline of the activation is timed on the bf16 kernel's problem.
        return
    [base] = runner(Job.baseline(problem, timing=SHORT))
    assert base.status is Status.OK and base.kernel_name == Baseline.GROUPED_MM.value, base.reason
    print(f"\n{kernel.config.name}: rel error {m.rel_error:.2e}, {m.tflops:.0f} TFLOP/s; "
          f"torch._grouped_mm + {problem.epilogue.name} {base.tflops:.0f}")


@pytest.mark.parametrize("kind", [Baseline.GROUPED_MM, Baseline.EXPERT_LOOP, Baseline.DENSE])
def test_the_grouped_baselines_apply_the_activation(kind):
    problem = Problem.experts(8, 256, 512, 1000, routing=Routing.HISTOGRAM, group_rows=(600, 0, 0, 300, 100, 0, 0, 0),
                              epilogue=Epilogue(activation=Activation.SILU))
    ops = allocate(problem, "cuda:0")
    randomize(ops, torch.Generator("cuda:0").manual_seed(0))
    target = baseline_target(problem, kind)
    assert target.setup(RuntimeArgs(), ops) is None
    verdict = target.check(ops, reference(ops))
    assert verdict.status is Status.OK, verdict.reason
    target.close()


def _table(cfg, problem: Problem) -> BestTable:
    row = dict(gpu="any", problem=problem.name, m=problem.m, n=problem.n, k=problem.k, kernel=cfg.name,
               config_hash=cfg.hash, config=json.dumps(cfg.to_dict(), sort_keys=True), raster="along_n", swizzle=1,
               splits=1, decomposition="heuristic", ratio=1.5, **problem.operation.cells(), **experts_cells(problem))
    return BestTable(pd.DataFrame([row]))


def test_grouped_mm_runs_the_activation_in_the_tuned_kernel_and_in_torch_s_path():
    cfg = GROUPED_FUSED[0]
    problem = _problem(cfg)
    activation = problem.epilogue.activation
    table = _table(cfg, problem)
    torch.manual_seed(0)
    a = torch.randn(problem.m, K, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(len(ROWS), N, K, dtype=torch.bfloat16, device="cuda") / 32
    offs = torch.tensor(ROWS, device="cuda").cumsum(0).to(torch.int32)
    want = ACTIVATION[activation](torch._grouped_mm(a, w.transpose(-2, -1), offs).float())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = cutlass_tune.grouped_mm(a, w.transpose(-2, -1), offs, table=table, activation=activation.value)
    # No fallback warning: the table's fused kernel ran.
    assert not [w for w in caught if "cutlass_tune" in str(w.message)], [str(w.message) for w in caught]
    assert ((got.float() - want).norm() / want.norm()).item() < 1e-2
    # An activation the table has no kernel for: torch's grouped GEMM, then the activation.
    with pytest.warns(RuntimeWarning):
        other = cutlass_tune.grouped_mm(a, w.transpose(-2, -1), offs, table=table, activation=Activation.RELU)
    torch.testing.assert_close(other, torch.relu(torch._grouped_mm(a, w.transpose(-2, -1), offs)), rtol=0, atol=0)
