"""`cutlass-tune shapes` records the fused operations the fusion pass and `patch(fuse=True)` run:
gated MLPs as a plain gate GEMM and a `silu+gated` up GEMM, residual adds as `residual`, on
modules shaped as transformers' LLaMA, BERT and GPT-NeoX layers (meta device, no weights)."""

import torch
import torch.nn.functional as F
from torch import nn

from cutlass_tune.capture import capture_gemms
from tests.test_capture import target, tn

BF16 = torch.bfloat16


def meta(*shape):
    return torch.empty(*shape, device="meta", dtype=BF16)


class LlamaMLP(nn.Module):
    def __init__(self, hidden, intermediate, bias=False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    """Attention reduced to its projections (the scores are batched GEMMs capture skips anyway)."""

    def __init__(self, hidden, intermediate, bias=False):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.mlp = LlamaMLP(hidden, intermediate, bias)

    def forward(self, x):
        residual = x
        x = residual + self.o_proj(self.v_proj(self.input_layernorm(x)))
        residual = x
        return residual + self.mlp(self.post_attention_layernorm(x))


class BertLayer(nn.Module):
    """BertSelfOutput, BertIntermediate and BertOutput: dense -> dropout -> LayerNorm(h + input)."""

    def __init__(self, hidden, intermediate):
        super().__init__()
        self.value = nn.Linear(hidden, hidden)
        self.attention_dense = nn.Linear(hidden, hidden)
        self.intermediate_dense = nn.Linear(hidden, intermediate)
        self.output_dense = nn.Linear(intermediate, hidden)
        self.dropout = nn.Dropout(0.1)
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)

    def forward(self, x):
        attention = self.norm1(self.dropout(self.attention_dense(self.value(x))) + x)
        h = F.gelu(self.intermediate_dense(attention))
        return self.norm2(self.dropout(self.output_dense(h)) + attention)


class GPTNeoXLayer(nn.Module):
    """use_parallel_residual: x + attention(ln1(x)) + mlp(ln2(x)), the MLP's GELU in its tanh form."""

    def __init__(self, hidden, intermediate):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.value = nn.Linear(hidden, hidden)
        self.dense = nn.Linear(hidden, hidden)
        self.dense_h_to_4h = nn.Linear(hidden, intermediate)
        self.dense_4h_to_h = nn.Linear(intermediate, hidden)

    def forward(self, x):
        attention = self.dense(self.value(self.ln1(x)))
        mlp = self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(self.ln2(x)), approximate="tanh"))
        return mlp + attention + x


def captured(module, *inputs, backward=False):
    module = module.to(device="meta", dtype=BF16).eval()  # dropout off, as in inference
    return capture_gemms(target(module, *inputs), backward=backward).problems()


def test_a_llama_layer_gives_a_plain_gate_a_gated_up_and_residual_projections():
    m = 2 * 8
    assert captured(LlamaLayer(64, 256), meta(2, 8, 64)) == {
        tn(m, 64, 64): {"aten.mm": 1},  # v_proj
        tn(m, 64, 64, epilogue="residual"): {"aten.mm": 1},  # o_proj, added to the residual stream
        tn(m, 256, 64): {"aten.mm": 1},  # gate_proj: its SiLU is read by up_proj's epilogue
        tn(m, 256, 64, epilogue="silu+gated"): {"aten.mm": 1},  # up_proj
        tn(m, 64, 256, epilogue="residual"): {"aten.mm": 1},  # down_proj
    }


def test_a_gated_mlp_with_biases_keeps_them_in_both_gemms():
    assert captured(LlamaMLP(64, 256, bias=True), meta(16, 64)) == {
        tn(16, 256, 64, epilogue="bias"): {"aten.addmm": 1},  # gate_proj
        tn(16, 256, 64, epilogue="bias+silu+gated"): {"aten.addmm": 1},  # up_proj
        tn(16, 64, 256, epilogue="bias"): {"aten.addmm": 1},  # down_proj: nothing added after it
    }


def test_a_bert_layer_gives_bias_gelu_and_bias_residual():
    m = 4 * 16
    assert captured(BertLayer(64, 256), meta(4, 16, 64)) == {
        tn(m, 64, 64, epilogue="bias"): {"aten.addmm": 1},  # value
        tn(m, 64, 64, epilogue="bias+residual"): {"aten.addmm": 1},  # attention output dense (+ x)
        tn(m, 256, 64, epilogue="bias+gelu"): {"aten.addmm": 1},  # intermediate, erf GELU
        tn(m, 64, 256, epilogue="bias+residual"): {"aten.addmm": 1},  # output dense (+ attention)
    }


def test_a_gpt_neox_layer_gives_bias_gelu_tanh_and_its_parallel_residual():
    m = 2 * 32
    assert captured(GPTNeoXLayer(64, 256), meta(2, 32, 64)) == {
        tn(m, 64, 64, epilogue="bias"): {"aten.addmm": 2},  # value, attention dense (ln2 runs next)
        tn(m, 256, 64, epilogue="bias+gelu_tanh"): {"aten.addmm": 1},  # dense_h_to_4h
        tn(m, 64, 256, epilogue="bias+residual"): {"aten.addmm": 1},  # dense_4h_to_h + attention
    }


def test_a_product_of_gemms_of_different_inputs_is_not_gated():
    """Guards the gated problem against two GEMMs that do not share x (the kernel reads one A)."""
    gate, up = nn.Linear(64, 128, bias=False), nn.Linear(64, 128, bias=False)
    gate, up = gate.to("meta", BF16), up.to("meta", BF16)

    def model(x, y):
        return F.silu(gate(x)) * up(y)

    assert capture_gemms(target(model, meta(16, 64), meta(16, 64))).problems() == {
        tn(16, 128, 64, epilogue="silu"): {"aten.mm": 1}, tn(16, 128, 64): {"aten.mm": 1}}


def test_an_add_that_broadcasts_or_reads_an_activation_is_not_a_residual():
    """Guards the residual against adds the kernel cannot take in place of the output (a row
    vector, an activation between)."""
    w = meta(128, 64)

    def model(x):
        a = x @ w.t() + meta(128)  # broadcast: a bias-like row, not an M x N residual
        b = F.relu(x @ w.t()) + a  # the activation is fused; what follows it is not the GEMM's
        return a + b

    assert capture_gemms(target(model, meta(16, 64))).problems() == {
        tn(16, 128, 64): {"aten.mm": 1}, tn(16, 128, 64, epilogue="relu"): {"aten.mm": 1}}


def test_the_backward_adds_no_residual_to_its_gemms():
    """Guards the backward's dX sums (gate's dX + up's dX) against being read as residual adds."""
    problems = captured(LlamaMLP(64, 256), meta(16, 64).requires_grad_(), backward=True)
    assert all(not p.epilogue.residual and not p.epilogue.gated for p, sources in problems.items()
               if any("backward" in s for s in sources))
    assert tn(16, 256, 64, epilogue="silu+gated") in problems
