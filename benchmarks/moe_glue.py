"""GPU time of the MoE experts layer's glue: routing, gather and combine, transformers' torch ops
against the layer's (torch ops, and the native kernels of cutlass_tune/native/moe.cu where built).

    python3 benchmarks/moe_glue.py OUT_DIR [--reps 50]

For each case (tokens, top_k, experts, hidden; bf16 rows, fp32 routing weights, random routing),
the median over `--reps` CUDA-event timings of:

- routing: transformers' (sort, floor-divide, histc, cumsum) and `moe_routing` (stable sort,
  searchsorted, inverse permutation);
- gather of token rows into routed rows: `hidden[perm // top_k]` and `moe_gather`;
- combine back to tokens: transformers' (weighted product, `inv_perm` index, view-sum, cast) and
  `moe_combine` (one pass where the native kernels are built);
- the combine's backward: autograd of transformers' ops and of `moe_combine`.

Writes OUT_DIR/moe_glue.json; prints the table last. The Qwen3-235B-shaped case at 4096 tokens
is the one whose glue a profile measured at 0.71 ms a layer (combine 0.45, gather 0.13, sort 0.06).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

CASES = [  # (name, tokens, top_k, experts, hidden)
    ("qwen3-235b prefill", 4096, 8, 128, 4096), ("qwen3-30b prefill", 4096, 8, 128, 2048),
    ("deepseek-v2-lite prefill", 4096, 6, 64, 2048), ("qwen3-235b decode", 64, 8, 128, 4096),
    ("mixtral prefill", 4096, 2, 8, 4096),
]


def median_ms(fn: Callable[[], object], reps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def transformers_routing(index: torch.Tensor, experts: int) -> tuple[torch.Tensor, ...]:
    ids = index.reshape(-1)
    ids_g, perm = torch.sort(ids)
    src = perm // index.shape[1]
    counts = torch.histc(ids_g.int(), bins=experts, min=0, max=experts - 1)
    return perm, src, torch.cumsum(counts, dim=0, dtype=torch.int32)


def transformers_combine(y: torch.Tensor, perm: torch.Tensor, weights: torch.Tensor, top_k: int) -> torch.Tensor:
    weighted = y * weights.reshape(-1)[perm].unsqueeze(-1)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.shape[0], device=perm.device)
    return weighted[inv].view(-1, top_k, y.shape[-1]).sum(dim=1).to(y.dtype)


def run_case(name: str, tokens: int, top_k: int, experts: int, hidden: int, reps: int) -> dict:
    from cutlass_tune.runtime import moe_combine, moe_gather, moe_routing

    torch.manual_seed(0)
    index = torch.rand(tokens, experts, device="cuda").topk(top_k, dim=-1).indices
    weights = torch.rand(tokens, top_k, device="cuda")
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(tokens * top_k, hidden, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    routing = moe_routing(index, experts)
    perm, src, _ = transformers_routing(index, experts)
    y_grad, w_grad = y.clone().requires_grad_(), weights.clone().requires_grad_()

    def backward(combine: Callable[[], torch.Tensor]) -> Callable[[], object]:
        return lambda: torch.autograd.grad(combine(), (y_grad, w_grad), grad)

    with torch.no_grad():
        row = {
            "case": name, "tokens": tokens, "top_k": top_k, "experts": experts, "hidden": hidden,
            "routing_transformers_ms": median_ms(lambda: transformers_routing(index, experts), reps),
            "routing_ms": median_ms(lambda: moe_routing(index, experts), reps),
            "gather_transformers_ms": median_ms(lambda: x[src], reps),
            "gather_ms": median_ms(lambda: moe_gather(x, routing), reps),
            "combine_transformers_ms": median_ms(lambda: transformers_combine(y, perm, weights, top_k), reps),
            "combine_ms": median_ms(lambda: moe_combine(y, routing, weights), reps),
        }
    row["combine_backward_transformers_ms"] = median_ms(
        backward(lambda: transformers_combine(y_grad, perm, w_grad, top_k)), reps)
    row["combine_backward_ms"] = median_ms(backward(lambda: moe_combine(y_grad, routing, w_grad)), reps)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    from cutlass_tune.runtime._moe_routing import native_available

    rows = [run_case(*case, args.reps) for case in CASES]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    result = {"native": native_available(), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "rows": rows}
    (args.out_dir / "moe_glue.json").write_text(json.dumps(result, indent=1))
    print(f"native kernels: {result['native']}, {result['device']}, torch {result['torch']}")
    print(f"{'case':26} {'routing':>15} {'gather':>15} {'combine':>15} {'combine bwd':>15}   (ms: transformers / ours)")
    for r in rows:
        cells = [f"{r[f'{part}_transformers_ms']:.3f}/{r[f'{part}_ms']:.3f}"
                 for part in ("routing", "gather", "combine", "combine_backward")]
        print(f"{r['case']:26} " + " ".join(f"{c:>15}" for c in cells))


if __name__ == "__main__":
    main()
