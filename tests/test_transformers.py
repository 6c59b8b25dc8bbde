"""The "cutlass_tune" experts implementation of transformers models (cutlass_tune/transformers.py).

On the CPU the operator computes with torch's grouped GEMM, as transformers' "grouped_mm" does:
these tests check the wiring (registration, the table, the forward's routing and weights), not
the tuned kernels (tests/runtime/test_grouped_gpu.py runs those)."""

import pandas as pd
import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5", reason="needs transformers >= 5")

import cutlass_tune.transformers as ct  # noqa: E402
from cutlass_tune.runtime import BestTable  # noqa: E402


def tiny_qwen3_moe(**extra):
    """A two-layer Qwen3-MoE of 8 experts (top 2), random weights, on the CPU in bfloat16."""
    config = transformers.Qwen3MoeConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
        decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, **extra).eval()


@pytest.fixture
def empty_table():
    ct.use_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})))


def test_registered_in_the_experts_interface():
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    assert ALL_EXPERTS_FUNCTIONS[ct.NAME] is ct.cutlass_tune_experts_forward


def test_model_outputs_equal_grouped_mm(empty_table):
    # Within one rounding of bfloat16: the layer weights the routed rows in fp32 (transformers
    # rounds each weighted row to bfloat16 before the sum).
    model = tiny_qwen3_moe(experts_implementation="grouped_mm")
    ids = torch.randint(0, 128, (3, 11))
    with torch.no_grad():
        want = model(ids).logits
        model.set_experts_implementation(ct.NAME)
        got = model(ids).logits
    assert model.config._experts_implementation == ct.NAME
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=4e-3)


def test_from_config_by_name_and_against_eager(empty_table):
    model = tiny_qwen3_moe(experts_implementation=ct.NAME)
    ids = torch.randint(0, 128, (2, 7))
    with torch.no_grad():
        got = model(ids).logits
        model.set_experts_implementation("eager")
        want = model(ids).logits
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_gradients_reach_the_experts(empty_table):
    """Guards the operator's autograd inside a model: the experts' weights get torch's gradients."""
    model = tiny_qwen3_moe(experts_implementation="grouped_mm").float()
    ids = torch.randint(0, 128, (2, 9))
    experts = model.model.layers[0].mlp.experts
    model(ids).logits.sum().backward()
    want = experts.gate_up_proj.grad.clone(), experts.down_proj.grad.clone()
    model.zero_grad()
    model.set_experts_implementation(ct.NAME)
    model(ids).logits.sum().backward()
    torch.testing.assert_close(experts.gate_up_proj.grad, want[0])
    torch.testing.assert_close(experts.down_proj.grad, want[1])


def test_no_table_is_one_line_error(monkeypatch):
    monkeypatch.setattr(ct, "_table_set", False)
    model = tiny_qwen3_moe(experts_implementation=ct.NAME)
    with pytest.raises(ct.NoTableError, match="use_table"):
        model(torch.randint(0, 128, (1, 4)))


def test_the_experts_take_the_runtimes_one_eager_direct_decision(monkeypatch):
    """Guards the experts deciding eager-direct versus the operator by a rule of their own."""
    asked = []

    def decide(*tensors):
        asked.append(tensors)
        return False

    monkeypatch.setattr(ct, "eager_direct_allowed", decide)
    monkeypatch.setattr(ct, "_direct_grouped_mm", lambda *args: pytest.fail("the direct path ran"))
    monkeypatch.setattr(ct, "grouped_mm_op", lambda x, b, offs, key: x.new_zeros((x.shape[0], b.shape[2])))
    x, w = torch.randn(4, 8), torch.randn(2, 6, 8)
    out = ct._grouped_linear(x, w, torch.tensor([2, 4], dtype=torch.int32), None, False)
    assert out.shape == (4, 6) and asked and asked[0][1] is w
