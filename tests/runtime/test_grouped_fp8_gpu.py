"""fp8 MoE experts with block-wise scales on a Hopper GPU: `cutlass_tune.grouped_mm(...,
scale_a=, scale_b=)` runs the ptr-array FP8Blockwise kernel (compiled on first use, nvcc, about
45 s) and every expert's rows match the fp32 reference of the dequantized math, with experts of 0
and 1 rows; new routing in the same offsets (also replayed from a CUDA graph) is read each
launch; torch's path where the table has none; and a tiny space swept end to end (sweep, best
table, grouped_mm on it).

Run on the GPU host: python3 -m pytest tests/runtime/test_grouped_fp8_gpu.py -m gpu -p no:cacheprovider -s
"""

import dataclasses
import json
import subprocess
import sys
import warnings

import pandas as pd
import pytest
import torch

import cutlass_tune
from cutlass_tune.bench._verify import allocate, compare_groups, randomize, reference
from cutlass_tune.runtime import BestTable
from cutlass_tune.runtime._grouped import torch_blockwise_grouped_mm
from cutlass_tune.space import DType, Grouping, KernelConfig, Problem, Routing, Scaling
from cutlass_tune.status import Status
from cutlass_tune.tables import experts_cells

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

N, K = 512, 1024
# Eight experts: empty ones (first, middle, last), single rows, sizes no tile divides.
ROWS = (0, 1, 37, 300, 0, 129, 1000, 0)
ROWS_AGAIN = (5, 0, 1, 700, 256, 3, 0, 502)  # the same rows routed otherwise
# The cooperative 128x128x128 kernel of benchmarks/configs/moe_fp8_blockwise.yaml (one compile for both).
KERNEL = KernelConfig(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128, scaling=Scaling.BLOCKWISE,
                      grouping=Grouping.GROUPED, epilogue_source=False)


def problem(rows=ROWS) -> Problem:
    return Problem.experts(len(rows), N, K, sum(rows), routing=Routing.HISTOGRAM, group_rows=rows,
                           **KERNEL.operation_fields())


def table_of(cfg: KernelConfig, p: Problem) -> BestTable:
    """A table whose one entry is `cfg` for `p`'s experts, measured faster than torch."""
    return BestTable(pd.DataFrame([dict(
        gpu="any", problem=p.name, m=p.m, n=p.n, k=p.k, kernel=cfg.name, config_hash=cfg.hash,
        config=json.dumps(cfg.to_dict(), sort_keys=True), raster="heuristic", swizzle=1, splits=1,
        decomposition="heuristic", ratio=1.5, **p.operation.cells(), **experts_cells(p))]))


def operands(p: Problem, seed: int = 0):
    ops = allocate(p, "cuda")
    randomize(ops, torch.Generator("cuda").manual_seed(seed))
    return ops


def call(ops, table, scale_b=None, **kw):
    return cutlass_tune.grouped_mm(ops.a, ops.b_kn, ops.offsets, table=table, scale_a=ops.scale_a,
                                   scale_b=ops.scale_b if scale_b is None else scale_b, **kw)


def assert_right(out, ops, p):
    verdict = compare_groups(out, reference(ops), p)
    assert verdict.status is Status.OK, verdict.reason
    print(f"{p.name}: relative error {verdict.rel_error:.2e}, worst element {verdict.worst_error:.3f} RMS")


def no_fallback(caught):
    assert not [w for w in caught if "cutlass_tune" in str(w.message)], [str(w.message) for w in caught]


def test_every_expert_matches_the_dequantized_fp32_reference():
    p = problem()
    ops, table = operands(p), table_of(KERNEL, p)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = call(ops, table)
        again = call(ops, table)  # the cached fast path
        transposed = call(ops, table, scale_b=ops.scale_b.transpose(-2, -1))  # b's view of the same scales
    no_fallback(caught)
    assert got.dtype == torch.bfloat16 and got.shape == (p.m, N)
    assert_right(got, ops, p)
    torch.testing.assert_close(again, got, rtol=0, atol=0)
    torch.testing.assert_close(transposed, got, rtol=0, atol=0)


def test_new_routing_in_the_same_offsets_is_read_each_launch_and_in_a_graph():
    """Guards the builder kernel reading offs (and so each expert's scale pointers) on the device."""
    p, again = problem(), problem(ROWS_AGAIN)
    ops, table = operands(p), table_of(KERNEL, p)
    assert_right(call(ops, table), ops, p)
    ops.offsets.copy_(torch.tensor(ROWS_AGAIN, device="cuda").cumsum(0).to(torch.int32))
    assert_right(call(ops, table), dataclasses.replace(ops, problem=again), again)  # A's scales are per row

    call(ops, table)  # loads and initializes outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(ops, table)
    ops.offsets.copy_(torch.tensor(ROWS, device="cuda").cumsum(0).to(torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    assert_right(out, ops, p)


def test_without_a_tuned_kernel_torchs_dequantized_grouped_gemm_runs():
    p = problem()
    ops = operands(p)
    other = Problem.experts(16, N, K, p.m, **KERNEL.operation_fields())  # other experts: no entry for these
    with pytest.warns(RuntimeWarning, match="using torch's grouped GEMM"):
        got = call(ops, table_of(KERNEL, other))
    want = torch_blockwise_grouped_mm(ops.a, ops.b_kn, ops.offsets, ops.scale_a, ops.scale_b)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert_right(got, ops, p)


SPACE = """\
description: one fp8 block-wise grouped problem, one kernel
problems:
  - {experts: 8, n: 512, k: 1024, rows: 1000, routing: zipf}
dtypes: [{input: e4m3, output: bf16}]
layouts: [tn]
scaling: blockwise
kernels:
  - {tile_m: [128], tile_n: [128], tile_k: [128], kernel_schedule: [cooperative], epilogue_source: [false]}
runtime:
  raster: [heuristic]
  swizzle: [1]
"""


def test_a_tiny_space_sweeps_end_to_end(tmp_path):
    space, store, csv = tmp_path / "space.yaml", tmp_path / "store.sqlite", tmp_path / "table.csv"
    space.write_text(SPACE)
    cli = [sys.executable, "-m", "cutlass_tune.cli"]
    swept = subprocess.run([*cli, "sweep", str(space), "--strategy", "optuna", "--trials", "1", "--batch", "1",
                            "--storage", str(store)], capture_output=True, text=True, timeout=600)
    assert swept.returncode == 0, swept.stdout[-2000:] + swept.stderr[-2000:]
    best = subprocess.run([*cli, "best", "--storage", str(store), "--format", "csv", "-o", str(csv)],
                          capture_output=True, text=True, timeout=120)
    assert best.returncode == 0, best.stdout[-2000:] + best.stderr[-2000:]
    rows = pd.read_csv(csv)
    assert len(rows) == 1 and rows["kernel"][0] == KERNEL.name, rows.to_string()
    assert rows["ratio"][0] > 0
    print(f"swept: {rows['problem'][0]} ratio {rows['ratio'][0]:.3f} to dequantize + torch._grouped_mm")
    p = Problem.experts(8, N, K, 1000, routing=Routing.ZIPF, **KERNEL.operation_fields())
    ops = operands(p, seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = call(ops, str(csv), min_ratio=0)
    no_fallback(caught)
    assert_right(got, ops, p)
