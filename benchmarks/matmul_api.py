"""`cutlass_tune.matmul` against torch.matmul, through the public API, in one run.

For every problem of a best-config table: check the result against an fp32 reference, then
time `cutlass_tune.matmul(a, w.t(), table)` (host-side lookup, workspace, initialize and
launch included) and `torch.matmul(a, w.t())` alternately, paired, with the same L2-cold
CUDA-event method the sweep uses, and print both ratios: through the API now, and the sweep's.

    python3 benchmarks/matmul_api.py results/sweep-nvidia-h200.sqlite
"""

from __future__ import annotations

import sys

import torch

import cutlass_tune
from cutlass_tune.bench import L2Flush, TimingOptions, time_paired


def main(source: str) -> None:
    table = cutlass_tune.BestTable.load(source)
    device = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(device)
    flush = L2Flush(device, props.L2_cache_size)
    options = TimingOptions(paired=True)
    print(f"{props.name}; torch {torch.__version__}; L2-cold CUDA events, paired, median (p20-p80)")
    print("| problem | rel. error | API TFLOP/s | torch TFLOP/s | API ratio | sweep ratio | kernel |")
    print("|---|---|---|---|---|---|---|")
    for row in table.frame.itertuples():
        a = torch.randn(row.m, row.k, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(row.n, row.k, dtype=torch.bfloat16, device="cuda")
        out = torch.empty(row.m, row.n, dtype=torch.bfloat16, device="cuda")
        got = cutlass_tune.matmul(a, w.t(), table=table)
        ref = a.float() @ w.float().t()
        err = ((got.float() - ref).norm() / ref.norm()).item()
        api, base = time_paired(lambda: cutlass_tune.matmul(a, w.t(), table=table),
                                lambda: torch.matmul(a, w.t(), out=out), options=options, flush=flush)
        flops = 2 * row.m * row.n * row.k
        t_api, t_base = flops / api.median_ms / 1e9, flops / base.median_ms / 1e9
        print(f"| {row.problem} | {err:.1e} | {t_api:.1f} ({flops / api.p80_ms / 1e9:.0f}-{flops / api.p20_ms / 1e9:.0f}) "
              f"| {t_base:.1f} | {t_api / t_base:.3f} | {row.ratio:.3f} | {row.kernel} {row.runtime} |")


if __name__ == "__main__":
    main(sys.argv[1])
