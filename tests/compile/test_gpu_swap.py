"""On a Hopper GPU: A/B-swapped fp8 row-wise kernels (`swap_ab`) compute the caller's D = s_a s_b
(A @ B^T) (+ bias) at small M, against a plain torch fp32 reference written here, the operands
passed as to any kernel (the swap is inside the kernel's arguments).

Run on the GPU host: `python3 -m pytest tests/compile/test_gpu_swap.py -m gpu -p no:cacheprovider -s`
(nvcc builds the two kernels of test_nvcc_swap.py into the user's kernel cache first, about a minute).
"""

import pytest
import torch

from cutlass_tune.compile import compile_kernels
from cutlass_tune.kernel import LoadedKernel, make_args
from cutlass_tune.space import KernelConfig, Problem, RuntimeArgs, check_pair
from cutlass_tune.status import Status

from .test_nvcc_swap import SWAPPED

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]
N, K = 2048, 1024


@pytest.fixture(scope="module")
def compiled():
    results = compile_kernels(SWAPPED)  # the user's kernel cache: a rerun finds them
    for r in results:
        assert r.status is Status.OK, f"{r.config.name}: {r.reason} (log {r.log_path})"
    return results


def _run(r, m: int, seed: int):
    cfg: KernelConfig = r.config
    problem = Problem(m, N, K, **cfg.operation_fields())
    assert check_pair(cfg, problem) == []
    g, dev = torch.Generator("cuda:0").manual_seed(seed), "cuda:0"
    ops = {"a": torch.randn(m, K, generator=g, device=dev).to(torch.float8_e4m3fn),
           "b": torch.randn(N, K, generator=g, device=dev).to(torch.float8_e4m3fn),  # B stored N x K: tn
           "d": torch.full((m, N), float("nan"), device=dev, dtype=torch.bfloat16),
           "scale_a": torch.rand(m, 1, generator=g, device=dev) * 0.05 + 0.01,
           "scale_b": torch.rand(1, N, generator=g, device=dev) + 0.25}
    if cfg.epilogue.bias:
        ops["bias"] = torch.randn(N, generator=g, device=dev).to(torch.bfloat16)
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    pointers = {k: v.data_ptr() for k, v in ops.items()}
    args = make_args(problem, RuntimeArgs(), device_id=0, sm_count=sm_count, **pointers)
    kernel = LoadedKernel(r.library, r.symbol)
    assert kernel.can_implement(args) == 0, cfg.name
    size = kernel.workspace_size(args)
    workspace = torch.zeros(max(size, 1), dtype=torch.uint8, device=dev)
    stream = torch.cuda.current_stream().cuda_stream
    with kernel.create() as gemm:
        gemm.initialize(args, workspace.data_ptr() if size else None, stream)
        gemm.run(stream)
        torch.cuda.synchronize()
    return ops


@pytest.mark.parametrize("m", [16, 32, 64, 50])
@pytest.mark.parametrize("index", range(len(SWAPPED)), ids=[c.name for c in SWAPPED])
def test_the_swapped_kernel_matches_the_fp32_reference(compiled, index, m):
    ops = _run(compiled[index], m, seed=m + index)
    want = ops["a"].float() @ ops["b"].float().t() * ops["scale_a"] * ops["scale_b"]
    if "bias" in ops:
        want = want + ops["bias"].float()
    got = ops["d"].float()
    assert torch.isfinite(got).all()
    rel = (torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want)).item()
    worst = (got - want).abs().max().item() / want.abs().max().item()
    print(f"\n{compiled[index].config.name} M={m}: rel error {rel:.2e}, worst {worst:.2e}")
    assert rel < 1e-2 and worst < 3e-2, (compiled[index].config.name, m, rel, worst)
