"""What a caller gets: each grouped entry of a best table called through `cutlass_tune.grouped_mm`
beside torch's grouped GEMM (`F.grouped_mm`, else `torch._grouped_mm`) on the same operands.

    python3 benchmarks/grouped_call_site.py TABLE OUT_DIR [--blocks 12] [--block-ms 150]

For each grouped row of TABLE (a best table, bundle or store): operands of its problem (A routed
rows x K, B the experts' E x N x K weights seen as E x K x N, the int32 offsets of its routed
rows), both outputs checked against each other first (relative Frobenius error), then sustained
timing: 2 s of warm-up, then blocks of back-to-back calls of each side in turn, each block timed
by CUDA events (the caller's regime: a model's stream of expert GEMMs at the board's power cap).
Reports the median per-call time of each side, the ratio torch / tuned per block pair (median,
p20-p80) and writes OUT_DIR/call_site.json; prints a table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from _blocks import block_ms as _block_ms  # beside this script

import cutlass_tune
from cutlass_tune.runtime import BestTable
from cutlass_tune.space import Layout, Operation, Problem, Routing

_TORCH = {"bf16": torch.bfloat16, "f16": torch.float16}


def _grouped_rows(table: BestTable) -> list[dict]:
    frame = table.frame
    if "grouping" not in frame.columns:
        return []
    return [r for r in frame.to_dict("records") if r["grouping"] == "grouped"]


def _problem(row: dict) -> Problem:
    """The row's problem, routed rows included (uniform or zipf: a histogram's counts are not in a table)."""
    routing = Routing(row["routing"])
    if routing is Routing.HISTOGRAM:
        raise ValueError(f"{row['problem']}: a histogram's counts are not in the table")
    operation = Operation.from_cells(row).operation_fields()
    return Problem.experts(int(row["groups"]), int(row["n"]), int(row["k"]), int(row["m"]), routing=routing,
                           **{f: v for f, v in operation.items() if f != "grouping"})


def _operands(p: Problem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dtype = _TORCH[p.dtype_a.value]
    a = torch.randn(p.m, p.k, device="cuda", dtype=dtype) * 0.5
    if p.layout_b is Layout.COL:
        b = (torch.randn(p.groups, p.n, p.k, device="cuda", dtype=dtype) * 0.5).transpose(-2, -1)
    else:
        b = torch.randn(p.groups, p.k, p.n, device="cuda", dtype=dtype) * 0.5
    offs = torch.tensor(p.group_rows, device="cuda", dtype=torch.int64).cumsum(0).to(torch.int32)
    return a, b, offs


def measure(table: BestTable, row: dict, blocks: int, block_ms: float) -> dict:
    p = _problem(row)
    a, b, offs = _operands(p)
    torch_grouped = getattr(F, "grouped_mm", None) or torch._grouped_mm

    def ours():
        return cutlass_tune.grouped_mm(a, b, offs, table=table)

    def theirs():
        return torch_grouped(a, b, offs=offs)

    ref, got = theirs().float(), ours().float()
    error = float((got - ref).norm() / ref.norm().clamp_min(1e-30))
    one = max(_block_ms(theirs, 3), 1e-3)
    calls = max(3, int(block_ms / one))
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        _block_ms(ours, calls)
        _block_ms(theirs, calls)
    mine, base, ratios = [], [], []
    for _ in range(blocks):
        t_ours, t_theirs = _block_ms(ours, calls), _block_ms(theirs, calls)
        mine.append(t_ours)
        base.append(t_theirs)
        ratios.append(t_theirs / t_ours)
    q = statistics.quantiles(ratios, n=5)
    return {"problem": p.name, "kernel": row["kernel"], "runtime": row["runtime"], "table_ratio": row["ratio"],
            "rel_error": error, "calls_per_block": calls, "tuned_ms": statistics.median(mine),
            "torch_ms": statistics.median(base), "tuned_tflops": p.flops / statistics.median(mine) / 1e9,
            "torch_tflops": p.flops / statistics.median(base) / 1e9, "ratio": statistics.median(ratios),
            "ratio_p20": q[0], "ratio_p80": q[3], "blocks": blocks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--block-ms", type=float, default=150.0)
    args = parser.parse_args()
    loaded = BestTable.load(args.table)
    table = loaded.for_gpu(torch.cuda.get_device_name())  # grouped_mm runs only this GPU model's kernels
    rows = _grouped_rows(table)
    if not rows:
        sys.exit(f"{args.table}: no grouped rows measured on {torch.cuda.get_device_name()} (the table's GPUs: "
                 f"{', '.join(loaded.gpus) or 'none'})")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for row in rows:
        results.append(measure(table, row, args.blocks, args.block_ms))
        torch.cuda.empty_cache()
    (args.out_dir / "call_site.json").write_text(json.dumps(
        {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": results}, indent=1))
    print(f"{'problem':58} {'torch TFLOP/s':>13} {'tuned':>7} {'ratio':>6} {'p20-p80':>12} {'table':>6} {'err':>8}")
    for r in results:
        print(f"{r['problem']:58} {r['torch_tflops']:13.0f} {r['tuned_tflops']:7.0f} {r['ratio']:6.3f} "
              f"{r['ratio_p20']:.3f}-{r['ratio_p80']:.3f} {r['table_ratio']:6.3f} {r['rel_error']:8.1e}")
    ratios = [r["ratio"] for r in results]
    print(f"geomean ratio (torch time / tuned time, sustained, at the call site): "
          f"{statistics.geometric_mean(ratios):.3f} over {len(ratios)} problems")


if __name__ == "__main__":
    main()
