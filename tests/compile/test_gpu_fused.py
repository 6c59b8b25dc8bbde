"""On a Hopper GPU: each fused epilogue the renderer emits computes what its name says, against a
plain torch fp32 reference written here (independent of the bench stage's), on cooperative and
ping-pong tiles, with an M that is no multiple of the tile or of the row scales' vector width.

Run on the GPU host: `python3 -m pytest tests/compile/test_gpu_fused.py -m gpu -p no:cacheprovider`
(nvcc builds the kernels into the user's kernel cache first: about a minute on 16 cores).
"""

import pytest
import torch
import torch.nn.functional as F

from cutlass_tune.compile import compile_kernels
from cutlass_tune.kernel import LoadedKernel, make_args
from cutlass_tune.space import Activation, Epilogue, KernelConfig, Problem, RuntimeArgs, Scaling, check_pair
from cutlass_tune.status import Status

from .test_nvcc_fused import E4M3, FUSED, PINGPONG

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

P = Epilogue.parse
CONFIGS = FUSED + [
    KernelConfig(epilogue=P("gelu")),
    KernelConfig(**PINGPONG, epilogue=P("bias+gelu_tanh+residual")),
    KernelConfig(**E4M3, **PINGPONG, scaling=Scaling.TENSOR, epilogue=P("bias+relu+residual")),
    KernelConfig(**E4M3, scaling=Scaling.ROWCOL, epilogue=P("silu+residual")),
]
M, N, K = 1000, 1024, 512
ACT = {Activation.NONE: lambda x: x, Activation.RELU: F.relu, Activation.SILU: F.silu,
       Activation.GELU: F.gelu, Activation.GELU_TANH: lambda x: F.gelu(x, approximate="tanh")}


@pytest.fixture(scope="module")
def compiled():
    results = compile_kernels(CONFIGS)  # the user's kernel cache: a rerun finds them
    for r in results:
        assert r.status is Status.OK, f"{r.config.name}: {r.reason} (log {r.log_path})"
    return results


def _operands(cfg: KernelConfig, g: torch.Generator):
    dev = "cuda:0"
    fp8 = cfg.dtype_a.is_fp8
    in_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    a = (torch.randn(M, K, generator=g, device=dev) * (1 if fp8 else 0.5)).to(in_dtype)
    b = (torch.randn(N, K, generator=g, device=dev) * (1 if fp8 else 0.5)).to(in_dtype)  # B stored N x K: tn
    ops = {"a": a, "b": b, "d": torch.full((M, N), float("nan"), device=dev, dtype=torch.bfloat16)}
    if cfg.epilogue.bias:
        ops["bias"] = torch.randn(N, generator=g, device=dev).to(torch.bfloat16)
    if cfg.epilogue.residual:
        ops["c"] = torch.randn(M, N, generator=g, device=dev).to(torch.bfloat16)
    if cfg.scaling is Scaling.TENSOR:
        ops["scale_a"] = torch.tensor([0.03], device=dev)
        ops["scale_b"] = torch.tensor([0.5], device=dev)
    elif cfg.scaling is Scaling.ROWCOL:
        ops["scale_a"] = torch.rand(M, 1, generator=g, device=dev) * 0.05 + 0.01
        ops["scale_b"] = torch.rand(1, N, generator=g, device=dev) + 0.25
    return ops


def _reference(activation: Activation, ops, alpha: float, beta: float) -> torch.Tensor:
    z = ops["a"].float() @ ops["b"].float().t()
    if "scale_a" in ops:
        z = z * ops["scale_a"].reshape(-1, 1) * ops["scale_b"].reshape(1, -1)
    z = alpha * z
    if "c" in ops:
        z = z + beta * ops["c"].float()
    if "bias" in ops:
        z = z + ops["bias"].float()
    return ACT[activation](z)


@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=[c.name for c in CONFIGS])
def test_the_fused_kernel_computes_its_epilogue(compiled, index):
    r = compiled[index]
    cfg = r.config
    problem = Problem(M, N, K, **cfg.operation_fields())
    assert check_pair(cfg, problem) == []
    ops = _operands(cfg, torch.Generator("cuda:0").manual_seed(index))
    alpha, beta = (0.75, 0.5) if cfg.epilogue.residual else (0.75, 0.0)
    pointers = {k: v.data_ptr() for k, v in ops.items()}
    args = make_args(problem, RuntimeArgs(), device_id=0, alpha=alpha, beta=beta,
                     sm_count=torch.cuda.get_device_properties(0).multi_processor_count, **pointers)
    kernel = LoadedKernel(r.library, r.symbol)
    assert kernel.can_implement(args) == 0, cfg.name
    size = kernel.workspace_size(args)
    workspace = torch.zeros(max(size, 1), dtype=torch.uint8, device="cuda:0")
    stream = torch.cuda.current_stream().cuda_stream
    with kernel.create() as gemm:
        gemm.initialize(args, workspace.data_ptr() if size else None, stream)
        gemm.run(stream)
        torch.cuda.synchronize()
    want = _reference(cfg.epilogue.activation, ops, alpha, beta)
    got = ops["d"].float()
    assert torch.isfinite(got).all(), cfg.name
    rel = (torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want)).item()
    worst = (got - want).abs().max().item() / want.abs().max().item()
    assert rel < 1e-2 and worst < 3e-2, (cfg.name, rel, worst)
    # the GELU form it names, not the other: they differ by up to 2e-4 per element, which the
    # tolerances cannot tell, but over a million outputs the systematic difference shows
    other = {Activation.GELU: Activation.GELU_TANH, Activation.GELU_TANH: Activation.GELU}.get(cfg.epilogue.activation)
    if other is not None:
        wrong = _reference(other, ops, alpha, beta)
        assert torch.linalg.vector_norm(got - want) < torch.linalg.vector_norm(got - wrong), cfg.name
