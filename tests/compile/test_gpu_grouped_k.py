"""On a Hopper GPU: the weight-gradient kernels (`Grouping.GROUPED_K`) compute dW_e = G_e^T X_e of
every expert, against an fp32 reference and against torch._grouped_mm(g.t(), x, offs) (what torch's
backward of a grouped GEMM runs), with experts of 0 rows (their dW_e exactly 0, from a D poisoned
with NaN), of 1 row and of counts no tile divides; `run` rebuilds the per-group arrays from the
offsets' current contents, also when replayed from a CUDA graph.

Run on the GPU host (nvcc first builds the kernels into the user's kernel cache, about a minute):
    python3 -m pytest tests/compile/test_gpu_grouped_k.py -m gpu -p no:cacheprovider -v
or, writing one JSON record per check under OUT and printing a table:
    python3 -m tests.compile.test_gpu_grouped_k OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from cutlass_tune.compile import compile_kernels
from cutlass_tune.kernel import LoadedKernel, make_args
from cutlass_tune.space import Problem, Routing, RuntimeArgs, check_pair
from cutlass_tune.status import Status

from .test_nvcc_grouped_k import GROUPED_K

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

N, K = 768, 512  # dW_e is N x K: G is M x N, X is M x K
# E = 8 experts: empty ones (first, middle and last), a single row, counts no tile K divides.
ROWS = (0, 1, 37, 300, 0, 129, 1000, 0)
# The same experts with other routing (other experts empty), for the runs after the offsets change.
ROWS_AGAIN = (5, 0, 1, 700, 256, 3, 0, 502)
TOLERANCE = 1e-2  # bf16 output


class WeightGradCase:
    """Operands of one weight-gradient kernel, its workspace, and the checks."""

    def __init__(self, compiled_kernel, seed: int = 0):
        self.cfg = cfg = compiled_kernel.config
        dev = "cuda:0"
        g = torch.Generator(dev).manual_seed(seed)
        m = sum(ROWS)
        assert sum(ROWS_AGAIN) == m
        self.problem = Problem.experts(len(ROWS), N, K, m, routing=Routing.HISTOGRAM, group_rows=ROWS,
                                       **cfg.operation_fields())
        assert check_pair(cfg, self.problem) == []
        self.g = (torch.randn(m, N, generator=g, device=dev) * 0.2).to(torch.bfloat16)
        self.x = (torch.randn(m, K, generator=g, device=dev) * 0.2).to(torch.bfloat16)
        self.d = torch.empty(len(ROWS), N, K, device=dev, dtype=torch.bfloat16)
        self.offsets = torch.empty(len(ROWS), device=dev, dtype=torch.int32)
        self.set_rows(ROWS)
        self.args = make_args(self.problem, RuntimeArgs(), a=self.g.data_ptr(), b=self.x.data_ptr(),
                              d=self.d.data_ptr(), offsets=self.offsets.data_ptr(), device_id=0,
                              sm_count=torch.cuda.get_device_properties(0).multi_processor_count)
        self.kernel = LoadedKernel(compiled_kernel.library, compiled_kernel.symbol)
        assert self.kernel.can_implement(self.args) == 0, cfg.name
        size = self.kernel.workspace_size(self.args)
        assert size > 0
        self.workspace = torch.zeros(size, dtype=torch.uint8, device=dev)

    def set_rows(self, rows) -> None:
        """Write the offsets of `rows` into the same device buffer, and poison D."""
        self.rows = rows
        self.offsets.copy_(torch.tensor(rows, dtype=torch.int32).cumsum(0))
        self.d.fill_(float("nan"))

    def errors(self) -> tuple[list[float], float]:
        """Each expert's error: relative Frobenius against fp32 for one with rows, the count of
        elements not exactly 0 for one without (NaN: left unwritten); and the kernel's relative
        Frobenius distance from torch._grouped_mm over the experts with rows."""
        torch.cuda.synchronize()
        out, start = [], 0
        for e, count in enumerate(self.rows):
            got = self.d[e].float()
            if count:
                want = self.g[start:start + count].float().t() @ self.x[start:start + count].float()
                out.append(float("nan") if not torch.isfinite(got).all()
                           else (torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want)).item())
            else:
                out.append(float(got.numel() - int((got == 0).sum())))
            start += count
        # Over the experts with rows: whether torch's own empty experts come out 0 is its business.
        used = torch.tensor([count > 0 for count in self.rows], device=self.d.device)
        torch_dw = torch._grouped_mm(self.g.t(), self.x, offs=self.offsets).float()[used]
        distance = torch.linalg.vector_norm(torch_dw - self.d[used].float())
        vs_torch = (distance / torch.linalg.vector_norm(torch_dw)).item()
        return out, vs_torch


def _worst(errors: list[float]) -> float:
    return max((float("inf") if e != e else e) for e in errors)


def check(compiled_kernel) -> list[dict]:
    """Run the three checks on one kernel; one record each (kernel, check, worst expert error)."""
    case = WeightGradCase(compiled_kernel)
    stream = torch.cuda.current_stream().cuda_stream
    records = []
    with case.kernel.create() as gemm:
        gemm.initialize(case.args, case.workspace.data_ptr(), stream)
        gemm.run(stream)
        records.append(("first run", *case.errors()))
        case.set_rows(ROWS_AGAIN)  # same address, new contents: no initialize
        gemm.run(stream)
        records.append(("offsets changed in place", *case.errors()))

        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.graph(graph, stream=side):
            gemm.run(side.cuda_stream)
        case.set_rows(ROWS)
        graph.replay()
        records.append(("graph replay, offsets changed", *case.errors()))
    return [{"kernel": case.cfg.name, "check": name, "worst_rel_error": _worst(errs), "experts": errs,
             "vs_torch_grouped_mm": vs_torch} for name, errs, vs_torch in records]


@pytest.mark.parametrize("index", range(len(GROUPED_K)), ids=[c.name for c in GROUPED_K])
def test_weight_gradient_kernel_computes_every_expert_zeroes_empty_ones_and_matches_torch(index):
    (compiled,) = [r for r in compile_kernels([GROUPED_K[index]])]  # the user's kernel cache
    assert compiled.status is Status.OK, f"{compiled.config.name}: {compiled.reason} (log {compiled.log_path})"
    for record in check(compiled):
        assert record["worst_rel_error"] < TOLERANCE, record
        assert record["vs_torch_grouped_mm"] < TOLERANCE, record


def main(out_dir: str) -> int:
    """Build, check and write `grouped_k_gpu.json` under `out_dir`; print a table; 1 on a failure."""
    records = []
    for r in compile_kernels(GROUPED_K):
        if r.status is not Status.OK:
            records.append({"kernel": r.config.name, "check": "compile", "worst_rel_error": float("inf"),
                            "vs_torch_grouped_mm": float("inf"), "reason": r.reason})
            continue
        records += check(r)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grouped_k_gpu.json").write_text(json.dumps(records, indent=1))
    print(f"{'kernel':72s} {'check':32s} worst rel. error  vs torch")
    ok = [rec["worst_rel_error"] < TOLERANCE and rec["vs_torch_grouped_mm"] < TOLERANCE for rec in records]
    for rec, good in zip(records, ok):
        print(f"{rec['kernel']:72s} {rec['check']:32s} {rec['worst_rel_error']:.2e}  "
              f"{rec['vs_torch_grouped_mm']:.2e} {'ok' if good else 'FAIL'}")
    return 0 if all(ok) else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 -m tests.compile.test_gpu_grouped_k OUT_DIR")
    sys.exit(main(sys.argv[1]))
