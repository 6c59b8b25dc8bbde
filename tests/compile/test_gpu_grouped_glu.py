"""On a Hopper GPU: the grouped GLU kernels (act(gate) * up in the gate_up GEMM's epilogue, D of
N/2 columns) against torch's act(x @ Wg^T) * (x @ Wu^T) per expert, on random routed rows with
experts of no rows and sizes no tile divides, and through the bench's own verification; then,
at the Qwen3-235B layer's shape, the GLU kernel's time beside the plain kernel of the same tile
followed by torch's act(gate) * up pass (printed: what benchmarks/moe_glu.md predicts).

Run on the GPU host (nvcc first builds the kernels into the user's kernel cache, 2-3 minutes):
    python3 -m pytest tests/compile/test_gpu_grouped_glu.py -m gpu -s -p no:cacheprovider"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import pytest
import torch

from cutlass_tune._torch import ACTIVATION
from cutlass_tune.bench import GpuRunner, Job, TimingOptions
from cutlass_tune.compile import compile_kernels
from cutlass_tune.kernel import LoadedKernel, make_args
from cutlass_tune.runtime import interleave_gate_up
from cutlass_tune.space import Epilogue, EpilogueSchedule, Problem, Routing, RuntimeArgs
from cutlass_tune.status import Status

from .test_nvcc_grouped_glu import GROUPED_GLU

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

INTER, K = 392, 512  # gate_up's N = 2 * INTER = 784: no tile N (128, 192) divides it
ROWS = (0, 1, 37, 300, 0, 129, 1000, 0)
GUARD = 16  # rows of D past M that the kernel must leave alone
SHORT = TimingOptions(budget_ms=30, warmup_ms=5)


@pytest.fixture(scope="module")
def compiled():
    results = compile_kernels(GROUPED_GLU)  # the user's kernel cache: a rerun finds them
    for r in results:
        assert r.status is Status.OK, f"{r.config.name}: {r.reason} (log {r.log_path})"
    return results


@contextlib.contextmanager
def _bound(result, a: torch.Tensor, w: torch.Tensor, rows: tuple[int, ...],
           d: torch.Tensor) -> Iterator[Callable[[], None]]:
    """The GLU kernel bound to D (M x N/2, row-major, at `d`), A's routed rows and the experts'
    interleaved E x N x K weights: yields one launch on the current stream."""
    problem = Problem.experts(len(rows), w.shape[1], w.shape[2], sum(rows), routing=Routing.HISTOGRAM,
                              group_rows=rows, **result.config.operation_fields())
    offsets = torch.tensor(rows, device="cuda").cumsum(0).to(torch.int32)
    args = make_args(problem, RuntimeArgs(), a=a.data_ptr(), b=w.data_ptr(), d=d.data_ptr(),
                     offsets=offsets.data_ptr(), device_id=torch.cuda.current_device(), sm_count=0)
    kernel = LoadedKernel(result.library, result.symbol)
    assert kernel.can_implement(args) == 0
    workspace = torch.empty(kernel.workspace_size(args), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    with kernel.create() as gemm:
        gemm.initialize(args, workspace.data_ptr(), stream)
        yield lambda: gemm.run(stream)
        torch.cuda.synchronize()


def _run(result, a: torch.Tensor, w: torch.Tensor, rows: tuple[int, ...], d: torch.Tensor) -> None:
    with _bound(result, a, w, rows, d) as launch:
        launch()


def _reference(a: torch.Tensor, w_split: torch.Tensor, rows: tuple[int, ...], epilogue: Epilogue) -> torch.Tensor:
    """act(x @ Wg^T) * (x @ Wu^T) per expert in fp32, from transformers' split gate_up."""
    out, start = [], 0
    for e, r in enumerate(rows):
        x = a[start:start + r].float()
        gate, up = w_split[e].float().chunk(2)
        out.append(ACTIVATION[epilogue.activation](x @ gate.T) * (x @ up.T))
        start += r
    return torch.cat(out)


@pytest.mark.parametrize("index", range(len(GROUPED_GLU)))
def test_a_glu_kernel_computes_the_gated_pair_of_each_expert(compiled, index):
    result = compiled[index]
    torch.manual_seed(index)
    m = sum(ROWS)
    a = torch.randn(m, K, dtype=torch.bfloat16, device="cuda")
    w_split = torch.randn(len(ROWS), 2 * INTER, K, dtype=torch.bfloat16, device="cuda") / 32
    d = torch.full((m + GUARD, INTER), float("nan"), dtype=torch.bfloat16, device="cuda")
    _run(result, a, interleave_gate_up(w_split), ROWS, d)
    assert torch.isnan(d[m:]).all(), "the kernel wrote past its M rows"
    got = d[:m]
    assert torch.isfinite(got).all(), "the kernel left rows or columns of D unwritten"
    want = _reference(a, w_split, ROWS, result.config.epilogue)
    torch.testing.assert_close(got.float(), want, rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("index", range(len(GROUPED_GLU)))
def test_the_bench_verifies_a_glu_kernel_against_its_fp32_reference(compiled, index):
    """The bench's operands follow `Epilogue.output_shape` (D of N/2) and its reference applies
    the GLU node's torch meaning: a GLU problem is measured like any other."""
    kernel = compiled[index]
    problem = Problem.experts(len(ROWS), 2 * INTER, K, sum(ROWS), routing=Routing.HISTOGRAM, group_rows=ROWS,
                              **kernel.config.operation_fields())
    [m] = GpuRunner(0)(Job.for_kernel(kernel, problem, (RuntimeArgs(),), timing=SHORT))
    assert m.status is Status.OK, m.reason  # the runner verified D against the fp32 reference first
    print(f"\n{kernel.config.name}: rel error {m.rel_error:.2e}, {m.tflops:.0f} TFLOP/s")


def _time_ms(fn, repeats: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def test_at_the_qwen3_layer_the_glu_kernel_replaces_the_gemm_and_the_activation_pass(compiled):
    """Qwen3-235B's gate_up at 4096 tokens x top 8: 128 experts of 256 rows, 2I = 3072, H = 4096."""
    glu = compiled[0]
    plain_cfg = dataclasses.replace(glu.config, epilogue=Epilogue(),
                                    epilogue_schedule=EpilogueSchedule.TMA_COOPERATIVE)
    [plain] = compile_kernels([plain_cfg])
    assert plain.status is Status.OK, plain.reason
    experts, inter, hidden = 128, 1536, 4096
    rows = (256,) * experts
    m = sum(rows)
    torch.manual_seed(0)
    a = torch.randn(m, hidden, dtype=torch.bfloat16, device="cuda")
    w_split = torch.randn(experts, 2 * inter, hidden, dtype=torch.bfloat16, device="cuda") / 64
    w = interleave_gate_up(w_split)
    d = torch.empty(m, inter, dtype=torch.bfloat16, device="cuda")
    h = torch.empty(m, 2 * inter, dtype=torch.bfloat16, device="cuda")
    _run(glu, a, w, rows, d)
    _run(plain, a, w_split, rows, h)
    gate, up = h.float().chunk(2, dim=-1)
    torch.testing.assert_close(d.float(), torch.nn.functional.silu(gate) * up, rtol=2e-2, atol=2e-2)
    with _bound(glu, a, w, rows, d) as launch_glu, _bound(plain, a, w_split, rows, h) as launch_plain:
        glu_ms = _time_ms(launch_glu)
        plain_ms = _time_ms(launch_plain)
    act_ms = _time_ms(lambda: torch.nn.functional.silu(h[:, :inter]) * h[:, inter:])
    print(f"\nQwen3-235B gate_up {m}x{2 * inter}x{hidden}, e{experts}: GLU kernel {glu_ms:.3f} ms; plain "
          f"{plain_ms:.3f} ms + act(gate)*up {act_ms:.3f} ms = {plain_ms + act_ms:.3f} ms (back-to-back "
          f"launches, warm L2)")
