"""Per problem of a sweep store: cuBLAS, the best kernel, its ratio, and when it was found.

"found at" counts distinct compiled configs in the order they were first measured (the store's
insertion order, across resumed runs). The ratio uses the cuBLAS figure of the same run.

    python3 benchmarks/sweep_report.py sqlite:///results/sweep-nvidia-h200.sqlite
"""

from __future__ import annotations

import sys

from cutlass_tune.store import ResultStore


def main(url: str) -> None:
    store = ResultStore(url)
    rows = store.rows()
    order: dict[str, int] = {}
    for r in rows:
        if r["config_hash"] and r["status"] != "invalid" and r["config_hash"] not in order:
            order[r["config_hash"]] = len(order) + 1
    print(f"store {url}: GPU {store.gpu()}, {len(order)} compiled configs, {len(rows)} rows")
    print("| problem | cuBLAS TFLOP/s | best TFLOP/s | ratio | p20-p80 ms | found at | kernel | run-time |")
    print("|---|---|---|---|---|---|---|---|")
    for problem in dict.fromkeys(r["problem"] for r in rows):
        ok = [r for r in rows if r["problem"] == problem and r["status"] == "ok" and r["kernel"] != "cuBLAS"]
        if not ok:
            print(f"| {problem} | - | - | - | - | - | no kernel passed | - |")
            continue
        best = max(ok, key=lambda r: r["ratio"] or 0.0)
        first = min(order[r["config_hash"]] for r in ok if r["config_hash"] == best["config_hash"])
        print(f"| {problem} | {best['cublas_tflops']:.1f} | {best['tflops']:.1f} | {best['ratio']:.3f} | "
              f"{best['p20_ms']:.4f}-{best['p80_ms']:.4f} | {first} of {len(order)} | {best['kernel']} | "
              f"{best['runtime']} |")


if __name__ == "__main__":
    main(sys.argv[1])
