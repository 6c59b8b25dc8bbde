"""Host time per grouped GEMM call: torch._grouped_mm against cutlass_tune's two paths.

    python3 benchmarks/grouped_host.py TABLE OUT_DIR [--calls 100] [--reps 15]

For each expert GEMM of benchmarks/configs/moe_e2e_bf16.yaml (Qwen3-30B-A3B and OLMoE, gate_up
and down, 512 and 4096 tokens), the microseconds of CPU time one call costs, the GPU kept busy
meanwhile (torch.cuda._sleep before each block of `--calls` calls: the host only enqueues, never
waits on a full queue or on the GPU), median of `--reps` blocks:

- torch._grouped_mm (what transformers' "grouped_mm" experts call),
- cutlass_tune.grouped_mm (what the "cutlass_tune" experts call in eager inference: a dict
  lookup, a kept workspace, an instance initialized once for repeating addresses),
- torch.ops.cutlass_tune.grouped_mm under no_grad (the operator: what training and
  torch.compile call),
- both compiled: a function of the one call under torch.compile (default mode, no CUDA graphs),
  torch._grouped_mm's beside the operator's, as a compiled decoder layer calls them.

Writes OUT_DIR/grouped_host.json; prints the table last.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from _blocks import host_ms  # beside this script

CASES = [  # (name, experts, n, k, tokens, top_k)
    ("qwen3 gate_up", 128, 1536, 2048, 512, 8), ("qwen3 down", 128, 2048, 768, 512, 8),
    ("olmoe gate_up", 64, 2048, 2048, 512, 8), ("olmoe down", 64, 2048, 1024, 512, 8),
    ("qwen3 gate_up", 128, 1536, 2048, 4096, 8), ("qwen3 down", 128, 2048, 768, 4096, 8),
    ("olmoe gate_up", 64, 2048, 2048, 4096, 8), ("olmoe down", 64, 2048, 1024, 4096, 8),
]


def host_us(fn: Callable[[], object], calls: int, reps: int) -> float:
    """Median CPU microseconds per call of `fn`, enqueued behind a GPU sleep long enough for all
    of a block's calls (`_blocks.host_ms`)."""
    cycles = int(torch.cuda.get_device_properties(0).clock_rate * 1e3 * calls * 400e-6)  # 400 us per call
    return host_ms(fn, calls, reps, busy_cycles=cycles, warm=3)[0] * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("table", help="best-config table or bundle holding the cases' grouped problems")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("grouped_host: needs a CUDA GPU", file=sys.stderr)
        return 2
    import cutlass_tune
    from cutlass_tune.runtime import BestTable, register_table

    table = BestTable.load(args.table)
    key = register_table(table, key="grouped-host")
    rows = []
    for name, e, n, k, tokens, top_k in CASES:
        m = tokens * top_k
        torch.manual_seed(0)
        a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(e, n, k, dtype=torch.bfloat16, device="cuda").transpose(-2, -1)
        offs = torch.arange(1, e + 1, device="cuda", dtype=torch.int32) * (m // e)
        torch._dynamo.reset()  # each case compiles afresh: its shapes, no recompile limit
        compiled_torch = torch.compile(lambda a, b, offs: torch._grouped_mm(a, b, offs))
        compiled_op = torch.compile(lambda a, b, offs: torch.ops.cutlass_tune.grouped_mm(a, b, offs, key))
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            want = torch._grouped_mm(a, b, offs)
            error = ((cutlass_tune.grouped_mm(a, b, offs, table=table).float() - want.float()).norm()
                     / want.float().norm()).item()
            us = {
                "torch._grouped_mm": host_us(lambda: torch._grouped_mm(a, b, offs), args.calls, args.reps),
                "cutlass_tune.grouped_mm": host_us(lambda: cutlass_tune.grouped_mm(a, b, offs, table=table),
                                                   args.calls, args.reps),
                "torch.ops.cutlass_tune.grouped_mm": host_us(lambda: torch.ops.cutlass_tune.grouped_mm(a, b, offs, key),
                                                             args.calls, args.reps),
                "compiled torch._grouped_mm": host_us(lambda: compiled_torch(a, b, offs), args.calls, args.reps),
                "compiled torch.ops.cutlass_tune.grouped_mm": host_us(lambda: compiled_op(a, b, offs), args.calls,
                                                                      args.reps),
            }
        fallbacks = [str(w.message) for w in caught if "cutlass_tune" in str(w.message)]
        rows.append({"case": name, "experts": e, "n": n, "k": k, "tokens": tokens, "rows": m, "host_us": us,
                     "relative_error": error, "fallbacks": fallbacks})
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "table": str(args.table),
              "calls": args.calls, "reps": args.reps, "cases": rows}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "grouped_host.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'case':<14} {'tokens':>6} {'torch us':>9} {'direct us':>10} {'operator us':>12} "
          f"{'torch cmp us':>13} {'op cmp us':>10} {'rel.err':>8} fallback")
    for r in rows:
        us = r["host_us"]
        print(f"{r['case']:<14} {r['tokens']:>6} {us['torch._grouped_mm']:>9.1f} "
              f"{us['cutlass_tune.grouped_mm']:>10.1f} {us['torch.ops.cutlass_tune.grouped_mm']:>12.1f} "
              f"{us['compiled torch._grouped_mm']:>13.1f} {us['compiled torch.ops.cutlass_tune.grouped_mm']:>10.1f} "
              f"{r['relative_error']:>8.1e} {len(r['fallbacks'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
