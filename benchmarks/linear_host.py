"""Host time per fused-linear call: torch's own calls against cutlass_tune's paths.

    python3 benchmarks/linear_host.py TABLE OUT_DIR [--calls 100] [--reps 15] [--label NAME]

For BERT-large's fused GEMMs at 8192 tokens (benchmarks/configs/fusion_e2e_bf16.yaml: the
Q/K/V projection with a bias, the intermediate projection with bias + erf GELU, the output
projection with bias + residual), the microseconds of CPU time one call costs, the GPU kept busy
meanwhile (`grouped_host.host_us`: the host only enqueues), median of `--reps` blocks:

- torch: F.linear, then the activation or the residual add (eager PyTorch);
- cutlass_tune.matmul with the epilogue's operands (the public call);
- torch.ops.cutlass_tune.linear under no_grad (the operator: what the fusion pass and a fused
  nn.Linear call);
- a patched nn.Linear (`cutlass_tune.nn.Linear` with the activation) under no_grad;
- torch's calls and the operator compiled: a function of the one layer under torch.compile
  (default mode, no CUDA graphs), as a compiled model calls them.

A model whose GEMMs take less GPU time than these host times waits on the host: the BERT-large
layers at 8192 tokens take 29-140 us each on an H200. Writes OUT_DIR/linear_host[-LABEL].json
and prints the table; `--label` names a run (e.g. the package version it measured).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from grouped_host import host_us  # beside this script

CASES = [  # (name, m, n, k, activation, residual)
    ("bert qkv bias", 8192, 1024, 1024, "none", False),
    ("bert intermediate bias+gelu", 8192, 4096, 1024, "gelu", False),
    ("bert output bias+residual", 8192, 1024, 4096, "none", True),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("table", help="best-config table or bundle with the cases' fused problems")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("linear_host: needs a CUDA GPU", file=sys.stderr)
        return 2
    import cutlass_tune
    from cutlass_tune.runtime import BestTable, register_table

    table = BestTable.load(args.table)
    key = register_table(table, key="linear-host")
    rows = []
    for name, m, n, k, activation, residual in CASES:
        torch.manual_seed(0)
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        layer = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
        c = torch.randn(m, n, dtype=torch.bfloat16, device="cuda") if residual else None
        act = torch.nn.GELU() if activation == "gelu" else torch.nn.Identity()
        fused = cutlass_tune.nn.Linear.from_linear(layer, table, activation=activation)
        w, bias = layer.weight, layer.bias

        def eager() -> torch.Tensor:
            y = F.linear(x, w, bias)
            return act(y if c is None else y + c)

        torch._dynamo.reset()  # each case compiles afresh: its shapes, no recompile limit
        compiled_torch = torch.compile(eager)
        compiled_op = torch.compile(lambda: torch.ops.cutlass_tune.linear(x, w, bias, activation, key, c))
        with torch.no_grad():
            want = eager()
            got = cutlass_tune.matmul(x, w.t(), table, bias=bias, activation=activation, c=c)
            error = ((got.float() - want.float()).norm() / want.float().norm()).item()
            us = {
                "torch": host_us(eager, args.calls, args.reps),
                "cutlass_tune.matmul": host_us(lambda: cutlass_tune.matmul(x, w.t(), table, bias=bias,
                                                                           activation=activation, c=c),
                                               args.calls, args.reps),
                "torch.ops.cutlass_tune.linear": host_us(lambda: torch.ops.cutlass_tune.linear(
                    x, w, bias, activation, key, c), args.calls, args.reps),
            }
            if c is None:
                us["cutlass_tune.nn.Linear"] = host_us(lambda: fused(x), args.calls, args.reps)
            us["compiled torch"] = host_us(compiled_torch, args.calls, args.reps)
            us["compiled torch.ops.cutlass_tune.linear"] = host_us(compiled_op, args.calls, args.reps)
        rows.append({"case": name, "m": m, "n": n, "k": k, "host_us": us, "relative_error": error})
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "label": args.label,
              "table": str(args.table), "calls": args.calls, "reps": args.reps, "cases": rows}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    suffix = f"-{args.label}" if args.label else ""
    (args.out_dir / f"linear_host{suffix}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'case':<28} {'torch us':>9} {'matmul us':>10} {'operator us':>12} {'nn.Linear us':>13} "
          f"{'torch cmp us':>13} {'op cmp us':>10} {'rel.err':>8}" + (f"  ({args.label})" if args.label else ""))
    for r in rows:
        us = r["host_us"]
        print(f"{r['case']:<28} {us['torch']:>9.1f} {us['cutlass_tune.matmul']:>10.1f} "
              f"{us['torch.ops.cutlass_tune.linear']:>12.1f} {us.get('cutlass_tune.nn.Linear', float('nan')):>13.1f} "
              f"{us['compiled torch']:>13.1f} {us['compiled torch.ops.cutlass_tune.linear']:>10.1f} "
              f"{r['relative_error']:>8.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
