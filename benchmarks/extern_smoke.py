"""A quick check of the operators' extern kernels on a CUDA GPU (runtime/_lowering.py), with the
native library built (`cutlass-tune native --build`) and a table without rows (torch's path from
C++, no kernel to compile): each operator (the MoE layer's gather and combine too) compiled alone,
the generated call and the result against the operator called eagerly. Prints one line an
operator; exit 1 on a mismatch.

    python3 benchmarks/extern_smoke.py
"""

from __future__ import annotations

import sys

import pandas as pd
import torch
from torch._inductor.utils import run_and_get_code

from cutlass_tune.runtime import BestTable, _moe_routing, _native, register_table


def main() -> int:
    if not torch.cuda.is_available() or _native.door is None or not _moe_routing.native_available():
        print("extern_smoke.py: needs a CUDA GPU and the native library (cutlass-tune native --build)", file=sys.stderr)
        return 2
    key = register_table(BestTable(pd.DataFrame()), key="extern-smoke")
    ops = torch.ops.cutlass_tune
    x = torch.randn(64, 512, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(256, 512, dtype=torch.bfloat16, device="cuda") / 16
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    sa, sb = torch.ones(64, 1, device="cuda"), torch.full((1, 256), 0.5, device="cuda")
    bias = torch.randn(256, dtype=torch.bfloat16, device="cuda")
    a = torch.randn(128, 512, dtype=torch.bfloat16, device="cuda")
    experts = torch.randn(4, 512, 256, dtype=torch.bfloat16, device="cuda") / 16
    offs = torch.tensor([32, 64, 96, 128], dtype=torch.int32, device="cuda")
    inv = torch.randperm(128, device="cuda")  # 64 tokens x top 2: each slot's routed row
    slot_weights = torch.rand(64, 2, device="cuda")
    cases = {"mm": lambda: ops.mm(x, w.t(), key),
             "linear": lambda: ops.linear(x, w, bias, "gelu", key, residual=x[:, :256].contiguous()),
             "grouped_mm": lambda: ops.grouped_mm(a, experts, offs, key),
             "scaled_mm": lambda: ops.scaled_mm(x8, w8.t(), sa, sb, None, key, torch.bfloat16),
             "moe_gather": lambda: ops.moe_gather(x, inv, slot_weights, 2),
             "moe_combine": lambda: ops.moe_combine(a, inv, slot_weights, 2)}
    failed = 0
    with torch.no_grad():
        for name, call in cases.items():
            torch._dynamo.reset()
            got, codes = run_and_get_code(torch.compile(lambda call=call: call() + 1))
            code = "\n".join(codes)
            lines = [line.strip() for line in code.splitlines() if f"cutlass_tune_extern.{name}_into(" in line]
            ok = len(lines) == 1 and torch.equal(got, call() + 1)
            failed += not ok
            print(f"{name:10} {'ok' if ok else 'MISMATCH'}  {lines[0] if lines else 'no extern call'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
