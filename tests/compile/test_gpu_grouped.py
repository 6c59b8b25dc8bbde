"""On a Hopper GPU: the grouped (ptr-array) kernels compute torch._grouped_mm's 2D x 3D product
for every expert, against an fp32 torch reference written here, with groups of 0 and 1 rows and
uneven sizes; `run` rebuilds the per-group arrays from the offsets' current contents (ABI 4's
run-refills contract), also when replayed from a CUDA graph.

Run on the GPU host (nvcc first builds the kernels into the user's kernel cache, about a minute):
    python3 -m pytest tests/compile/test_gpu_grouped.py -m gpu -p no:cacheprovider
or, writing one JSON record per check under OUT and printing a table:
    python3 -m tests.compile.test_gpu_grouped OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from cutlass_tune.compile import compile_kernels
from cutlass_tune.kernel import LoadedKernel, make_args
from cutlass_tune.space import DType, Layout, Problem, Routing, RuntimeArgs, check_pair
from cutlass_tune.status import Status

from .test_nvcc_grouped import GROUPED

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

N, K = 768, 512
# E = 8 experts: empty ones (first, middle and last), single rows, sizes no tile divides.
ROWS = (0, 1, 37, 300, 0, 129, 1000, 0)
# The same experts with other routing, for the runs after the offsets change in place.
ROWS_AGAIN = (5, 0, 1, 700, 256, 3, 0, 502)
TORCH_DTYPE = {DType.BF16: torch.bfloat16, DType.F16: torch.float16}


@pytest.fixture(scope="module")
def compiled():
    results = compile_kernels(GROUPED)  # the user's kernel cache: a rerun finds them
    for r in results:
        assert r.status is Status.OK, f"{r.config.name}: {r.reason} (log {r.log_path})"
    return results


class GroupedCase:
    """Operands of one grouped kernel, its bound instance and workspace, and the checks."""

    def __init__(self, compiled_kernel, seed: int = 0):
        self.cfg = cfg = compiled_kernel.config
        dev, dtype = "cuda:0", TORCH_DTYPE[cfg.dtype_a]
        g = torch.Generator(dev).manual_seed(seed)
        m = sum(ROWS)
        assert sum(ROWS_AGAIN) == m
        self.problem = Problem.experts(len(ROWS), N, K, m, routing=Routing.HISTOGRAM, group_rows=ROWS,
                                       **cfg.operation_fields())
        assert check_pair(cfg, self.problem) == []
        self.a = (torch.randn(m, K, generator=g, device=dev) * 0.5).to(dtype)
        shape = (len(ROWS), N, K) if cfg.layout_b is Layout.COL else (len(ROWS), K, N)
        self.b = (torch.randn(*shape, generator=g, device=dev) * 0.5).to(dtype)
        self.d = torch.empty(m, N, device=dev, dtype=dtype)
        self.offsets = torch.empty(len(ROWS), device=dev, dtype=torch.int32)
        self.set_rows(ROWS)
        self.args = make_args(self.problem, RuntimeArgs(), a=self.a.data_ptr(), b=self.b.data_ptr(),
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

    def errors(self) -> list[float]:
        """Relative Frobenius error of each non-empty group against fp32 (NaN where a row of D
        was left unwritten)."""
        torch.cuda.synchronize()
        out, start = [], 0
        for e, count in enumerate(self.rows):
            got = self.d[start:start + count].float()
            w = self.b[e].float()
            want = self.a[start:start + count].float() @ (w.t() if self.cfg.layout_b is Layout.COL else w)
            if count:
                out.append(float("nan") if not torch.isfinite(got).all()
                           else (torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want)).item())
            start += count
        assert start == self.d.shape[0]
        return out


def _worst(errors: list[float]) -> float:
    return max((float("inf") if e != e else e) for e in errors)


def check(compiled_kernel) -> list[dict]:
    """Run the three checks on one kernel; one record each (kernel, check, worst group error)."""
    case = GroupedCase(compiled_kernel)
    stream = torch.cuda.current_stream().cuda_stream
    records = []
    with case.kernel.create() as gemm:
        gemm.initialize(case.args, case.workspace.data_ptr(), stream)
        gemm.run(stream)
        records.append(("first run", case.errors()))
        case.set_rows(ROWS_AGAIN)  # same address, new contents: no initialize
        gemm.run(stream)
        records.append(("offsets changed in place", case.errors()))

        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.graph(graph, stream=side):
            gemm.run(side.cuda_stream)
        case.set_rows(ROWS)
        graph.replay()
        records.append(("graph replay, offsets changed", case.errors()))
    return [{"kernel": case.cfg.name, "check": name, "worst_rel_error": _worst(errs), "groups": errs}
            for name, errs in records]


@pytest.mark.parametrize("index", range(len(GROUPED)), ids=[c.name for c in GROUPED])
def test_grouped_kernel_computes_every_group_and_refills_from_the_offsets(compiled, index):
    for record in check(compiled[index]):
        assert record["worst_rel_error"] < 1e-2, record


def main(out_dir: str) -> int:
    """Build, check and write `grouped_gpu.json` under `out_dir`; print a table; 1 on a failure."""
    results = compile_kernels(GROUPED)
    records = []
    for r in results:
        if r.status is not Status.OK:
            records.append({"kernel": r.config.name, "check": "compile", "worst_rel_error": float("inf"),
                            "reason": r.reason})
            continue
        records += check(r)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grouped_gpu.json").write_text(json.dumps(records, indent=1))
    print(f"{'kernel':78s} {'check':32s} worst rel. error")
    for rec in records:
        verdict = "ok" if rec["worst_rel_error"] < 1e-2 else "FAIL"
        print(f"{rec['kernel']:78s} {rec['check']:32s} {rec['worst_rel_error']:.2e} {verdict}")
    return 0 if all(rec["worst_rel_error"] < 1e-2 for rec in records) else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 -m tests.compile.test_gpu_grouped OUT_DIR")
    sys.exit(main(sys.argv[1]))
