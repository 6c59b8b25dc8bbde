"""`cutlass_tune.matmul` against torch.matmul, through the public API, in one run.

For every problem of a best-config table: check the result against an fp32 reference, then
time `cutlass_tune.matmul(a, w.t(), table)` (host-side lookup, workspace, initialize and
launch included) and `torch.matmul(a, w.t())` alternately, paired, with the same L2-cold
CUDA-event method the sweep uses; then, the same way, the table's kernel through a `Gemm`
object writing into a preallocated output (no lookup, no allocation: what the sweep timed).
Prints the three ratios: through the API, through `Gemm`, and the sweep's. Where the first two
agree and differ from the third, the GPU's state moved the ratio, not the API.

    python3 benchmarks/matmul_api.py results/sweep-nvidia-h200.sqlite [--min-m 2048]
"""

from __future__ import annotations

import argparse

import torch

import cutlass_tune
from cutlass_tune.bench import L2Flush, TimingOptions, time_paired


def main(source: str, min_m: int = 0) -> None:
    table = cutlass_tune.BestTable.load(source)
    device = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(device)
    flush = L2Flush(device, props.L2_cache_size)
    options = TimingOptions(paired=True)
    print(f"{props.name}; torch {torch.__version__}; L2-cold CUDA events, paired, median (p20-p80)")
    print("| problem | rel. error | API TFLOP/s | torch TFLOP/s | API ratio | Gemm ratio | sweep ratio | kernel |")
    print("|---|---|---|---|---|---|---|---|")
    for row in table.frame.itertuples():
        if row.m < min_m:
            continue
        a = torch.randn(row.m, row.k, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(row.n, row.k, dtype=torch.bfloat16, device="cuda")
        out = torch.empty(row.m, row.n, dtype=torch.bfloat16, device="cuda")
        got = cutlass_tune.matmul(a, w.t(), table=table)
        ref = a.float() @ w.float().t()
        err = ((got.float() - ref).norm() / ref.norm()).item()
        api, base = time_paired(lambda: cutlass_tune.matmul(a, w.t(), table=table),
                                lambda: torch.matmul(a, w.t(), out=out), options=options, flush=flush)
        match = table.lookup(row.m, row.n, row.k, row.dtype_a, row.layout)
        gemm, out_k = cutlass_tune.Gemm(match.config, match.runtime), torch.empty_like(out)
        direct, base_k = time_paired(lambda: gemm(a, w.t(), out=out_k),
                                     lambda: torch.matmul(a, w.t(), out=out), options=options, flush=flush)
        flops = 2 * row.m * row.n * row.k
        t_api, t_base = flops / api.median_ms / 1e9, flops / base.median_ms / 1e9
        low, high = flops / api.p80_ms / 1e9, flops / api.p20_ms / 1e9
        print(f"| {row.problem} | {err:.1e} | {t_api:.1f} ({low:.0f}-{high:.0f}) "
              f"| {t_base:.1f} | {t_api / t_base:.3f} | {base_k.median_ms / direct.median_ms:.3f} "
              f"| {row.ratio:.3f} | {row.kernel} {row.runtime} |", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a store URL or file, or a best-config table")
    parser.add_argument("--min-m", type=int, default=0, help="skip problems with a smaller M")
    cli = parser.parse_args()
    main(cli.source, cli.min_m)
