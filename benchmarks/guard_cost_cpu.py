"""Dynamo's guard evaluation per call of a compiled transformers decoder layer, the "cutlass_tune"
experts against transformers' "grouped_mm" and "batched_mm" ones, on the CPU (no GPU needed).

    PYTHONPATH=. python3 benchmarks/guard_cost_cpu.py [--tokens 1] [--plan] [--family olmoe|deepseek_v2]

A tiny model of the family (`--family`, default olmoe; one decoder layer, float32) is built:
OLMoE (hidden 64, 8 experts of 32, top 2) or DeepSeek-V2 (DeepSeek-V2-Lite's layout: a MoE layer
with no dense layer before it, MLA attention without a q LoRA, greedy top-k routing; hidden 64,
8 routed experts of 32, top 2, one shared expert), its layer compiled (default backend), and one
step run with each experts implementation, so the layer's code cache holds one entry per
implementation. Then each entry's guards are checked against the layer's own arguments of the
last call (`guard_manager.check`, the work Dynamo does on every call of the compiled frame before
it runs the cached code): 1,000 checks a block, 15 blocks alternating between the three, the
median microseconds per check printed. `--plan` gives
`use_table` the model before the first compiled call (its experts planned in eager code);
without it the "cutlass_tune" layer traces its plan. The same figures hold the layer's guard
count: run with TORCH_LOGS=guards to read them.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time

import pandas as pd
import torch

try:
    import transformers
except ImportError:  # pragma: no cover - the script says what it needs
    raise SystemExit("guard_cost_cpu: needs transformers >= 5") from None

import cutlass_tune.transformers as ct
from cutlass_tune import BestTable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1, help="sequences of one token (a decode step)")
    parser.add_argument("--plan", action="store_true", help="use_table(table, model=model) before compiling")
    parser.add_argument("--family", choices=("olmoe", "deepseek_v2"), default="olmoe",
                        help="the tiny model's family (default olmoe)")
    args = parser.parse_args()
    config = _config(args.family)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                          experts_implementation="grouped_mm")
    layer = model.model.layers[0]
    if not ct.experts_modules(layer.mlp):
        raise SystemExit(f"guard_cost_cpu: the {args.family} layer's mlp ({type(layer.mlp).__name__}) has no experts")
    ct.use_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})), model=model if args.plan else None)
    layer.compile()
    seen: dict = {}
    layer.register_forward_pre_hook(lambda module, a, k: seen.update(args=a, kwargs=k), with_kwargs=True)
    ids = torch.randint(0, 128, (args.tokens, 1))
    torch._dynamo.config.recompile_limit = 64
    names = ("grouped_mm", "batched_mm", ct.NAME)
    torch.set_grad_enabled(False)  # the steps' global state: the guards check it too
    for name in names:
        model.set_experts_implementation(name)
        for _ in range(2):
            model(ids, use_cache=False)
    forward = type(layer).forward
    # The frame's locals as Dynamo sees them: the forward's own parameters (transformers 5.24 wraps
    # it in (self, *args, **kwargs); 5.17 names them).
    bound = inspect.signature(forward, follow_wrapped=False).bind(layer, *seen["args"], **seen["kwargs"])
    bound.apply_defaults()
    frame = dict(bound.arguments)
    frame.update({name: cell.cell_contents for name, cell in zip(forward.__code__.co_freevars,
                                                                 forward.__closure__ or ())})
    entries = torch._C._dynamo.eval_frame._debug_get_cache_entry_list(forward.__code__)
    passing = {}
    for name in names:
        model.set_experts_implementation(name)
        found = [e.guard_manager for e in entries if e.guard_manager.check(frame)]
        if len(found) != 1:
            raise SystemExit(f"guard_cost_cpu: {len(found)} cache entries pass for {name}, not one")
        passing[name] = found[0]
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(15):
        for name, guards in passing.items():
            model.set_experts_implementation(name)
            start = time.perf_counter()
            for _ in range(1000):
                guards.check(frame)
            times[name].append((time.perf_counter() - start) / 1000 * 1e6)
    us = {name: statistics.median(t) for name, t in times.items()}
    print(f"{args.family}, tokens {args.tokens}, plan given {args.plan}: guards us a call " +
          ", ".join(f"{n} {v:.1f}" for n, v in us.items()) + f"; ratio {us[ct.NAME] / us['grouped_mm']:.2f}, "
          f"against batched_mm {us[ct.NAME] / us['batched_mm']:.2f}")


def _config(family: str) -> transformers.PreTrainedConfig:
    """The tiny one-layer config of `family`: its one decoder layer a MoE layer."""
    if family == "deepseek_v2":
        return transformers.DeepseekV2Config(vocab_size=128, num_hidden_layers=1, hidden_size=64,
                                             intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
                                             num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=0,
                                             topk_method="greedy", norm_topk_prob=False, num_attention_heads=4,
                                             num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32,
                                             qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, head_dim=8,
                                             bos_token_id=0, eos_token_id=0, max_position_embeddings=256)
    return transformers.OlmoeConfig(vocab_size=128, num_hidden_layers=1, hidden_size=64, intermediate_size=32,
                                    num_attention_heads=4, num_key_value_heads=4, num_experts=8,
                                    num_experts_per_tok=2, norm_topk_prob=False, eos_token_id=0,
                                    max_position_embeddings=256)


if __name__ == "__main__":
    main()
