"""On a Hopper GPU: fp8 (e4m3 -> bf16, TN) kernels against the fp32 reference and torch._scaled_mm.

Run with `python3 -m pytest tests/bench/test_gpu_fp8.py -m gpu -s` on the GPU host (`-s` prints
the errors and TFLOP/s; nvcc builds the two kernels into the kernel cache first, under a minute).
"""

import pytest
import torch

from cutlass_tune.bench import GpuRunner, Job, TimingOptions
from cutlass_tune.bench._verify import FP8_TOLERANCE, reference
from cutlass_tune.compile import compile_kernels
from cutlass_tune.space import DType, KernelConfig, Problem, RasterOrder, RuntimeArgs
from cutlass_tune.status import Status

from .conftest import launch_once, spy_on_timing

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

E4M3 = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_c=DType.BF16, dtype_d=DType.BF16)
# Two kernels of configs/fp8_quick.yaml: the same tile with and without fast accumulation.
FAST = KernelConfig(**E4M3, tile_m=128, tile_n=256, tile_k=128, cluster_m=2, fp8_fast_accum=True)
PROMOTING = KernelConfig(**E4M3, tile_m=128, tile_n=256, tile_k=128, cluster_m=2)
P4096 = Problem(4096, 4096, 4096, dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16)
SHORT = TimingOptions(budget_ms=20, warmup_ms=5)


@pytest.fixture(scope="module")
def fp8_kernels():
    results = compile_kernels([FAST, PROMOTING])  # the user's kernel cache: a rerun finds them
    for r in results:
        assert r.status is Status.OK, f"{r.config.name}: {r.reason} (log {r.log_path})"
    return {"fast": results[0], "promoting": results[1]}


def _rel(out, ref):
    return (torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref)).item()


@pytest.mark.parametrize("name", ["fast", "promoting"])
def test_fp8_kernel_matches_the_reference_and_scaled_mm_at_4096(fp8_kernels, name):
    compiled = fp8_kernels[name]
    ops = launch_once(compiled, P4096)
    assert ops.a.dtype == torch.float8_e4m3fn and ops.b.shape == (4096, 4096)
    ref = reference(ops)
    one = torch.ones((), dtype=torch.float32, device="cuda:0")
    scaled = torch._scaled_mm(ops.a, ops.b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    err, err_torch, err_between = _rel(ops.d, ref), _rel(scaled, ref), _rel(ops.d, scaled.float())
    print(f"\n{compiled.config.name}: rel error {err:.2e}, torch._scaled_mm {err_torch:.2e}, "
          f"between them {err_between:.2e}")
    assert torch.isfinite(ops.d).all()
    assert err < FP8_TOLERANCE and err_torch < FP8_TOLERANCE and err_between < FP8_TOLERANCE


def test_fp8_kernels_and_scaled_mm_are_timed_by_the_same_function(fp8_kernels, monkeypatch):
    timed = spy_on_timing(monkeypatch)
    runner = GpuRunner(0)
    variants = (RuntimeArgs(raster=RasterOrder.ALONG_M, swizzle=1), RuntimeArgs(raster=RasterOrder.ALONG_N, swizzle=4))
    [base] = runner(Job.baseline(P4096, timing=SHORT))
    kernels = {name: list(runner(Job.for_kernel(fp8_kernels[name], P4096, variants, timing=SHORT)))
               for name in ("fast", "promoting")}
    assert timed == [("CublasTarget",)] + [("CutlassTarget",)] * 4
    assert base.status is Status.OK, base.reason
    print(f"\ntorch._scaled_mm: {base.tflops:.1f} TFLOP/s, rel error {base.rel_error:.2e}")
    for name, ms in kernels.items():
        for m in ms:
            assert m.status is Status.OK, (name, m.runtime.name, m.reason)
            assert m.method == base.method == "events" and m.env == base.env
            assert m.rel_error < FP8_TOLERANCE
            print(f"{m.kernel_name} {name} {m.runtime.name}: {m.tflops:.1f} TFLOP/s "
                  f"({m.tflops / base.tflops:.3f} of torch._scaled_mm), rel error {m.rel_error:.2e}")
    assert base.rel_error < FP8_TOLERANCE
    fastest = min(m.median_ms for ms in kernels.values() for m in ms)
    assert 0.2 < base.median_ms / fastest < 5
