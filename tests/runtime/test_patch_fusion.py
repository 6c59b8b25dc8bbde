"""cutlass_tune.patch fusing a Linear with what follows it, on the CPU (the operator's CPU kernel
is torch's math): nn.Sequential, modules named as transformers' MLPs (BERT, GPT-NeoX, GPT-J,
LLaMA), what the report says of each, and outputs equal to the unpatched model."""

import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlass_tune
from cutlass_tune.nn import Linear
from cutlass_tune.runtime._patch import GatedMLP, activation_of_module, operator_takes
from cutlass_tune.space import Activation

from .fusion_tables import fused_table

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
BF16 = torch.bfloat16


class GELUActivation(nn.Module):  # transformers.activations' names, as the structure shows them
    def forward(self, x):
        return F.gelu(x)


class NewGELUActivation(nn.Module):
    def forward(self, x):
        return F.gelu(x, approximate="tanh")


class BertIntermediate(nn.Module):
    def __init__(self, hidden=32, inner=64):
        super().__init__()
        self.dense = nn.Linear(hidden, inner, dtype=BF16)
        self.intermediate_act_fn = GELUActivation()

    def forward(self, x):
        return self.intermediate_act_fn(self.dense(x))


class GPTNeoXMLP(nn.Module):
    def __init__(self, hidden=32, inner=64):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(hidden, inner, dtype=BF16)
        self.dense_4h_to_h = nn.Linear(inner, hidden, dtype=BF16)
        self.act = NewGELUActivation()

    def forward(self, x):
        return self.dense_4h_to_h(self.act(self.dense_h_to_4h(x)))


class LlamaMLP(nn.Module):
    def __init__(self, hidden=32, inner=64):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False, dtype=BF16)
        self.up_proj = nn.Linear(hidden, inner, bias=False, dtype=BF16)
        self.down_proj = nn.Linear(inner, hidden, bias=False, dtype=BF16)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bert = BertIntermediate()
        self.neox = GPTNeoXMLP()
        self.mlp = LlamaMLP()
        self.seq = nn.Sequential(nn.Linear(32, 64, dtype=BF16), nn.ReLU(), nn.Linear(64, 32, dtype=BF16), nn.Tanh())

    def forward(self, x):
        return self.bert(x).sum(-1, keepdim=True) + self.neox(x) + self.mlp(x) + self.seq(x)


TABLE = [("bias+gelu", 64, 32, 1.2), ("bias+gelu_tanh", 64, 32, 1.1), ("silu+gated", 64, 32, 1.3),
         ("bias+relu", 64, 32, 0.9), ("bias", 32, 64, 1.05)]  # a plain swap of a Linear with a bias needs "bias"


@pytest.mark.parametrize(("module", "expected"), [
    (nn.GELU(), Activation.GELU), (nn.GELU(approximate="tanh"), Activation.GELU_TANH), (nn.ReLU(), Activation.RELU),
    (nn.SiLU(), Activation.SILU), (GELUActivation(), Activation.GELU), (NewGELUActivation(), Activation.GELU_TANH),
    (F.silu, Activation.SILU), (functools.partial(F.gelu, approximate="tanh"), Activation.GELU_TANH),
    (nn.ReLU(inplace=True), None), (nn.Tanh(), None), (nn.Dropout(), None)])
def test_activation_modules_are_read_as_the_kernels_activations(module, expected):
    assert activation_of_module(module) is expected


def test_the_report_names_each_fusion_and_why_the_rest_was_not_fused():
    model = Model()
    report = cutlass_tune.patch(model, fused_table(TABLE), cuda_only=False)
    by = {d.name: d for d in report.layers}
    assert by["bert.dense"].fused == "bias+gelu" and by["neox.dense_h_to_4h"].fused == "bias+gelu_tanh"
    assert by["bert.dense"].reason.startswith("fused with intermediate_act_fn: bf16 tn bias+gelu N=64, K=32")
    assert type(model.bert.dense) is Linear and model.bert.dense.activation is Activation.GELU
    assert type(model.bert.intermediate_act_fn) is nn.Identity
    assert by["seq.0"].fused == "" and by["seq.0"].fusion == (
        "not fused with 1: bf16 tn bias+relu N=64, K=32: tuned at 0.900x torch at best, below min_ratio 1.0 "
        "(torch's path is kept)")
    assert by["seq.2"].fusion == "not fused with 3: Tanh, not an activation the fused kernels compute (relu, gelu, " \
                                 "gelu_tanh, silu)"
    assert by["neox.dense_4h_to_h"].swapped and not by["neox.dense_4h_to_h"].fused
    assert model.neox.dense_4h_to_h.fused_bias
    assert "fused with what follows" in str(report).splitlines()[0]
    if operator_takes("gate"):
        assert by["mlp.up_proj"].fused == "silu+gated" and type(model.mlp) is GatedMLP
        assert by["mlp.up_proj"].reason.startswith("fused with gate_proj and act_fn: bf16 tn silu+gated N=64, K=32")


def test_a_fused_model_computes_what_it_did_and_keeps_its_state_dict():
    model = Model()
    before = copy.deepcopy(model)
    cutlass_tune.patch(model, fused_table(TABLE), cuda_only=False)
    assert list(model.state_dict()) == list(before.state_dict())
    x = torch.randn(2, 5, 32, dtype=BF16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), before(x), rtol=1.6e-2, atol=3e-2)
    # with a gradient, the unfused path runs: same result, gradients reach the shared parameters
    model(x).float().sum().backward()
    assert model.mlp.up_proj.weight.grad is not None and model.bert.dense.weight.grad is not None


def test_without_fuse_or_entries_nothing_is_fused():
    model = Model()
    report = cutlass_tune.patch(model, fused_table(TABLE), cuda_only=False, fuse=False)
    assert not report.fused and type(model.bert.intermediate_act_fn) is GELUActivation
    report = cutlass_tune.patch(Model(), fused_table([("none", 64, 32, 1.1)]), cuda_only=False)
    assert not report.fused
    assert {d.name: d.fusion for d in report.layers}["bert.dense"] == (
        "not fused with intermediate_act_fn: the table has no tn bias+gelu entries")


def test_transformers_mlps_if_installed():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, vocab_size=64)
    model = transformers.LlamaForCausalLM(config).to(BF16).eval()
    before = copy.deepcopy(model)
    report = cutlass_tune.patch(model, fused_table([("silu+gated", 64, 32, 1.3)]), cuda_only=False)
    assert [d.name for d in report.fused] == ["model.layers.0.mlp.up_proj"]
    ids = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before(ids).logits, rtol=3e-2, atol=5e-2)


def test_an_entry_that_beats_eager_but_not_cublaslts_epilogue_is_not_fused():
    # Regression: coverage read the ratio to eager only, so a kernel 1.1x eager's F.gelu(F.linear)
    # but 0.95x cuBLASLt's own bias+GELU epilogue (the strongest torch path) was fused.
    table = fused_table([("bias+gelu_tanh", 64, 32, 1.1)])
    table.frame["strongest_ratio"] = 0.95
    report = cutlass_tune.patch(Model(), table, cuda_only=False)
    assert {d.name: d.fused for d in report.layers}["neox.dense_h_to_4h"] == ""
    assert "tuned at 0.950x torch at best, below min_ratio 1.0" in {d.name: d.fusion for d in report.layers}[
        "neox.dense_h_to_4h"]
