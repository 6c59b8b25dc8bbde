"""A 4-layer Qwen3-MoE model of Qwen3-235B-A22B's widths (128 experts of 1536, top 8, hidden 4096),
random bf16 weights, on the GPU, its experts the "cutlass_tune" ones: the model `tune-model` tunes
in benchmarks/gpu_tune_model.sh.

    cutlass-tune tune-model benchmarks/tune_model_qwen3.py:build --table TABLE --tokens 4096 ...
"""

from __future__ import annotations

import torch
import transformers
from moe_model import FAMILIES, VOCAB  # beside this file

import cutlass_tune.transformers  # noqa: F401  (registers the "cutlass_tune" experts)

LAYERS = 4


def build(tokens: int = 4096, family: str = "qwen3_235b"):
    """(model, (input ids,)): one sequence of `tokens` tokens."""
    spec = FAMILIES[family]
    config = getattr(transformers, spec["config"])(vocab_size=VOCAB, num_hidden_layers=LAYERS,
                                                   max_position_embeddings=32768, **spec["kwargs"])
    torch.manual_seed(0)
    with torch.device("cuda"):  # the random init of 128 experts takes minutes on the host's CPU
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16,
                                                              experts_implementation="cutlass_tune")
        return model, (torch.randint(0, VOCAB, (1, tokens)),)
