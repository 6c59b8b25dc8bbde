"""Decoder-only clients for `cutlass-tune shapes` and benchmarks/model_e2e.py: Llama models built from
a `transformers` config with random weights (nothing downloaded).

    cutlass-tune shapes benchmarks/models/llama.py:llama_33b -o benchmarks/configs/model_llama33b_bf16.yaml

`llama_33b` has the widths of LLaMA 33B (hidden 6656, MLP 17920, 52 heads, no grouped KV) and a
serving-size batch of 4 sequences of 1024 tokens (M = 4096); `llama3_8b` those of Llama 3 8B
(hidden 4096, MLP 14336, 32 heads, 8 KV heads). Both keep a few layers: the GEMM shapes of a
decoder do not depend on its depth, and the timing of a few layers fits one GPU call. Built on
the meta device unless `device` says otherwise.
"""

from __future__ import annotations

import torch

BATCH, SEQ = 4, 1024


def build(hidden: int, mlp: int, heads: int, kv_heads: int, layers: int = 2, vocab: int = 32000,
          device: str = "meta", batch: int = BATCH, seq: int = SEQ) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """A bf16 LlamaForCausalLM of these widths with random weights, in eval mode, and its input ids."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                         max_position_embeddings=max(seq, 2048))
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    if device != "meta":
        for p in model.parameters():  # small weights keep the logits of random layers finite in bf16
            torch.nn.init.normal_(p, std=0.02)
    ids = torch.randint(0, vocab, (batch, seq), device=device) if device != "meta" else \
        torch.zeros(batch, seq, dtype=torch.long, device=device)
    return model, (ids,)


def llama_33b(device: str = "meta", layers: int = 2) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    return build(6656, 17920, 52, 52, layers=layers, device=device)


def llama3_8b(device: str = "meta", layers: int = 2) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    return build(4096, 14336, 32, 8, layers=layers, vocab=128256, device=device)


def llama_33b_m256(device: str = "meta", layers: int = 2) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """LLaMA-33B widths at 4 prompts of 64 tokens (M = 256): a small serving batch, where the
    projections read their weights more than they compute."""
    return build(6656, 17920, 52, 52, layers=layers, device=device, batch=4, seq=64)
