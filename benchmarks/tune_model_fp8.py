"""A dense model run in fp8: 4 decoder blocks of Llama-3-8B's widths (hidden 4096, fused q/k/v
4096 -> 6144 of 32 query and 8 key/value heads of 128, output 4096 -> 4096, fused gate/up
4096 -> 2 x 14336, down 14336 -> 4096, no biases), random weights, every Linear a
`cutlass_tune.nn.Fp8Linear` (row-wise scales: one per output feature, one per token, the input
quantized at each call), on the GPU (on the meta device where there is none): the model
`tune-model` tunes in benchmarks/gpu_tune_model_fp8.sh; `build_torch` is the same model on torch's
own path (quantization and torch._scaled_mm with fast accumulation), its `--baseline`.

    cutlass-tune shapes benchmarks/tune_model_fp8.py:both -o fp8.yaml    # both token counts' problems
    cutlass-tune tune-model benchmarks/tune_model_fp8.py:build --table TABLE --tokens 128 --tokens 2048 ...

Its four GEMM problems per token count M (e4m3 x e4m3 -> bf16, tn, row-wise): M x 6144 x 4096
(q/k/v), M x 4096 x 4096 (output), M x 28672 x 4096 (gate/up), M x 4096 x 14336 (down).

The attention's score and value products are left out (a flash kernel in the real model, not a
Linear a table tunes): the output projection reads q gated by v, so every Linear's input depends
on the one before it. The Linears read their table from `TABLE_KEY`, the key `tune-model` binds
each step's table to; where nothing is bound there (`shapes`, a plain forward) an empty table is,
and every call takes torch._scaled_mm's path. Compiled (`--mode compiled`), each Linear's GEMM is
the operator `torch.ops.cutlass_tune.scaled_mm` inside the one graph (it reads the table bound to
`TABLE_KEY` at every call, so `tune-model` switches tables between steps with no retrace);
Inductor compiles the norms, gates, residuals and the inputs' quantization around it.
"""

from __future__ import annotations

import pandas as pd
import torch
import torch.nn.functional as F

from cutlass_tune import BestTable, register_table
from cutlass_tune.bench._in_model import TABLE_KEY
from cutlass_tune.nn import Fp8Linear
from cutlass_tune.runtime._fp8 import quantize_rowwise
from cutlass_tune.runtime._op import UnregisteredTableError, registered_table

LAYERS = 4
HIDDEN, INTERMEDIATE = 4096, 14336
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


class TorchFp8Linear(torch.nn.Module):
    """An `Fp8Linear`'s weights on torch's own path, the strongest torch offers for the math:
    the input quantized the same way, then torch._scaled_mm with fast accumulation, all of it in
    the graph under torch.compile (the baseline `tune-model --baseline` times the model against)."""

    def __init__(self, linear: Fp8Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.weight_scale = linear.weight, linear.weight_scale

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        xq, scale_a = quantize_rowwise(input.reshape(-1, self.in_features))
        y = torch._scaled_mm(xq, self.weight.t(), scale_a, self.weight_scale, out_dtype=torch.bfloat16,
                             use_fast_accum=True)
        return y.reshape(*input.shape[:-1], self.out_features)


def _fp8(in_features: int, out_features: int) -> Fp8Linear:
    """A random bf16 Linear (no bias) quantized row-wise, on the current default device."""
    return Fp8Linear.from_linear(torch.nn.Linear(in_features, out_features, bias=False, dtype=torch.bfloat16),
                                 TABLE_KEY, scaling="rowwise")


class Block(torch.nn.Module):
    """One decoder block: RMSNorm, q/k/v, (attention left out), output + residual; RMSNorm,
    gate/up, SiLU-gated, down + residual."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = _fp8(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM)
        self.o = _fp8(HEADS * HEAD_DIM, HIDDEN)
        self.gate_up = _fp8(HIDDEN, 2 * INTERMEDIATE)
        self.down = _fp8(INTERMEDIATE, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, _, v = self.qkv(F.rms_norm(x, (HIDDEN,))).split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM,
                                                               KV_HEADS * HEAD_DIM], dim=-1)
        x = x + self.o(q * torch.sigmoid(v).repeat_interleave(HEADS // KV_HEADS, dim=-1))
        gate, up = self.gate_up(F.rms_norm(x, (HIDDEN,))).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Model(torch.nn.Module):
    def __init__(self, layers: int = LAYERS) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


TOKENS = (128, 2048)
"""The token counts tuned: a decode-sized batch (memory-bound GEMMs) and a prefill chunk (compute-bound)."""


class Both(torch.nn.Module):
    """The model run on each of several inputs in turn (`shapes` calls a function without
    arguments and records one forward: this one poses every token count's problems)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        return [self.model(x) for x in inputs]


def both(layers: int = LAYERS):
    """(model, (hidden states per count of `TOKENS`,)): `build`'s model at every token count."""
    model, _ = build(TOKENS[0], layers)
    with torch.device("cuda" if torch.cuda.is_available() else "meta"):
        return Both(model), tuple(torch.randn(1, n, HIDDEN, dtype=torch.bfloat16) for n in TOKENS)


def build(tokens: int = TOKENS[-1], layers: int = LAYERS):
    """(model, (hidden states,)): one sequence of `tokens` tokens, bf16, on the GPU (else meta)."""
    try:
        registered_table(TABLE_KEY)
    except UnregisteredTableError:  # no tune-model: the plain path of every call
        register_table(BestTable(pd.DataFrame()), key=TABLE_KEY)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "meta"):
        model = Model(layers).eval()
        return model, (torch.randn(1, tokens, HIDDEN, dtype=torch.bfloat16),)


def build_torch(tokens: int = TOKENS[-1], layers: int = LAYERS):
    """`build`'s model (the same weights and input: the same seed) with every Linear on torch's own
    path (`TorchFp8Linear`): `tune-model --baseline`'s torch side."""
    model, inputs = build(tokens, layers)
    for block in model.blocks:
        for name in ("qkv", "o", "gate_up", "down"):
            setattr(block, name, TorchFp8Linear(getattr(block, name)))
    return model, inputs
