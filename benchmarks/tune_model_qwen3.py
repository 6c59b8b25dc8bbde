"""A 4-layer Qwen3-MoE model of Qwen3-235B-A22B's widths (128 experts of 1536, top 8, hidden 4096),
random bf16 weights, on the GPU, its experts the "cutlass_tune" ones: the model `tune-model` tunes
in benchmarks/gpu_tune_model.sh.

    cutlass-tune tune-model benchmarks/tune_model_qwen3.py:build --table TABLE --tokens 4096 \
        --baseline benchmarks/tune_model_qwen3.py:build_torch ...
"""

from __future__ import annotations

import torch
import transformers
from moe_model import FAMILIES, VOCAB  # beside this file

import cutlass_tune.transformers  # noqa: F401  (registers the "cutlass_tune" experts)

LAYERS = 4


def build(tokens: int = 4096, family: str = "qwen3_235b", layers: int = LAYERS, experts: str = "cutlass_tune"):
    """(model, (input ids,)): one sequence of `tokens` tokens; `experts` transformers' experts
    implementation."""
    spec = FAMILIES[family]
    config = getattr(transformers, spec["config"])(vocab_size=VOCAB, num_hidden_layers=layers,
                                                   max_position_embeddings=32768, **spec["kwargs"])
    torch.manual_seed(0)
    with torch.device("cuda"):  # the random init of 128 experts takes minutes on the host's CPU
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16,
                                                              experts_implementation=experts)
        return model, (torch.randint(0, VOCAB, (1, tokens)),)


def build_torch(tokens: int = 4096, family: str = "qwen3_235b", layers: int = LAYERS):
    """`build`'s model (same seed: the same weights and ids) with transformers' "grouped_mm"
    experts: `tune-model --baseline`'s torch side."""
    return build(tokens, family, layers, experts="grouped_mm")


def _torch_experts(family: str):
    """One layer of `family` with transformers' "grouped_mm" experts, built on the GPU with its
    random router, and 4096 random ids: what `cutlass-tune shapes --device cuda` runs to record the
    experts' GEMMs with the router's real routing (a histogram per grouped problem; on the meta
    device, or from zero ids, it would be uniform or degenerate)."""
    return build(family=family, layers=1, experts="grouped_mm")


def qwen3_235b_routed():
    """`_torch_experts` of Qwen3-235B-A22B's widths at 4096 tokens (gpu_moe_glu.sh ROUTING=captured)."""
    return _torch_experts("qwen3_235b")


def deepseek_v2_routed():
    """`_torch_experts` of DeepSeek-V2-Lite's widths at 4096 tokens (gpu_moe_glu.sh ROUTING=captured)."""
    return _torch_experts("deepseek_v2")


def gpt_oss_routed():
    """`_torch_experts` of GPT-OSS-20B's widths at 4096 tokens: its expert GEMMs with the router's
    own routing (a sweep of uniform routing chose a gate_up kernel that ran at parity in the layer:
    benchmarks/moe_layer.md, "GPT-OSS-20B-shaped from nothing")."""
    return _torch_experts("gpt_oss")


def gpt_oss(tokens: int = 4096):
    """`build` of GPT-OSS-20B's widths: `tune-model benchmarks/tune_model_qwen3.py:gpt_oss`."""
    return build(tokens, "gpt_oss")


def gpt_oss_torch(tokens: int = 4096):
    """`build_torch` of GPT-OSS-20B's widths: that tune-model's `--baseline`."""
    return build_torch(tokens, "gpt_oss")
