"""End-to-end MoE forward: transformers' "grouped_mm" experts vs the tuned "cutlass_tune" ones.

    python3 benchmarks/moe_model.py TABLE OUT_DIR [--layers 4] [--tokens 4096] [--blocks 10] [--block 10]

A Qwen3-30B-A3B-shaped model (hidden 2048, 128 experts of moe_intermediate 768, top 8, 32 heads,
4 KV heads of 128) cut to a few layers with random bf16 weights, run in inference (no_grad) on
one prompt of `--tokens` tokens. Sustained timing: blocks of `--block` forwards of each
implementation in turn, each block timed by CUDA events, the median block per forward reported
(alternating keeps clocks and heat alike for both). The outputs of both are compared first.
Writes OUT_DIR/moe_model.json; prints the speedup (grouped_mm ms / cutlass_tune ms) last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path

import torch


def _model(layers: int):
    import transformers

    config = transformers.Qwen3MoeConfig(
        vocab_size=8192, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=32768, norm_topk_prob=True)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16,
                                                         experts_implementation="grouped_mm").cuda().eval()


def _block_ms(fn, count: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(count):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("table", help="best-config table, bundle or store with the model's grouped problems")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--block", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("moe_model: needs a CUDA GPU", file=sys.stderr)
        return 2
    import cutlass_tune.transformers as ct

    ct.use_table(args.table)
    model = _model(args.layers)
    ids = torch.randint(0, 8192, (1, args.tokens), device="cuda")
    names = ("grouped_mm", ct.NAME)
    logits, fallbacks = {}, []
    with torch.no_grad():
        for name in names:
            model.set_experts_implementation(name)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                logits[name] = model(ids).logits.float()
            fallbacks += [str(w.message) for w in caught if "cutlass_tune" in str(w.message)]
        error = ((logits[ct.NAME] - logits["grouped_mm"]).norm() / logits["grouped_mm"].norm()).item()
        blocks: dict[str, list[float]] = {name: [] for name in names}
        for name in names:  # warm up both
            model.set_experts_implementation(name)
            _block_ms(lambda: model(ids), 3)
        for _ in range(args.blocks):
            for name in names:
                model.set_experts_implementation(name)
                blocks[name].append(_block_ms(lambda: model(ids), args.block))
    ms = {name: statistics.median(times) for name, times in blocks.items()}
    ratio = ms["grouped_mm"] / ms[ct.NAME]
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "table": str(args.table),
              "layers": args.layers, "tokens": args.tokens, "experts": 128, "top_k": 8, "hidden": 2048,
              "moe_intermediate": 768, "median_ms": ms, "blocks_ms": blocks, "relative_error": error,
              "fallbacks": fallbacks, "speedup": ratio}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "moe_model.json").write_text(json.dumps(result, indent=2) + "\n")
    for message in fallbacks:
        print(f"fallback: {message}")
    print(f"{'implementation':<14} {'ms/forward':>10}")
    for name in names:
        print(f"{name:<14} {ms[name]:>10.3f}")
    print(f"relative error of the logits: {error:.2e}")
    print(f"speedup cutlass_tune over grouped_mm: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
