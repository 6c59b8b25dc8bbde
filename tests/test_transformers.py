"""The "cutlass_tune" experts implementation of transformers models (cutlass_tune/transformers.py).

On the CPU the operator computes with torch's grouped GEMM, as transformers' "grouped_mm" does:
these tests check the wiring (registration, the table, the forward's routing and weights), not
the tuned kernels (tests/runtime/test_grouped_gpu.py runs those)."""

import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5", reason="needs transformers >= 5")

import cutlass_tune  # noqa: E402
import cutlass_tune.transformers as ct  # noqa: E402
from cutlass_tune.runtime import BestTable  # noqa: E402
from cutlass_tune.runtime._moe import ExpertsLayout  # noqa: E402
from cutlass_tune.runtime._moe_gates import experts_plan  # noqa: E402


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


# ---------------------------------------------------------------------------------------------
# The fused experts layer (cutlass_tune.moe_experts) for the families it computes

_COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64)
FAMILIES = {
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**_COMMON, head_dim=16, moe_intermediate_size=32, num_experts=8,
                                                     num_experts_per_tok=2, mlp_only_layers=[]),
    "mixtral": lambda: transformers.MixtralConfig(**_COMMON, head_dim=16, num_local_experts=8, num_experts_per_tok=2),
    "olmoe": lambda: transformers.OlmoeConfig(**_COMMON, num_experts=8, num_experts_per_tok=2),
    "gpt_oss": lambda: transformers.GptOssConfig(**_COMMON, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
                                                 layer_types=["full_attention"] * 2),
}


def family_model(family, dtype, implementation="grouped_mm"):
    """A tiny two-layer model of `family`, every weight drawn N(0, 0.05) (GPT-OSS's biases too)."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES[family](), dtype=dtype,
                                                          experts_implementation=implementation).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    return model


def logits_by(model, ids, *implementations):
    out = []
    with torch.no_grad():
        for name in implementations:
            model.set_experts_implementation(name)
            out.append(model(ids).logits.float())
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_runs_the_layer_and_matches_grouped_mm_and_eager(empty_table, family):
    model = family_model(family, torch.float32)
    ids = torch.randint(0, 128, (2, 9))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no family falls back to the glue
        got, grouped, eager = logits_by(model, ids, ct.NAME, "grouped_mm", "eager")
    experts = model.model.layers[0].mlp.experts
    assert isinstance(experts_plan(experts), ExpertsLayout)
    torch.testing.assert_close(got, grouped, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_bfloat16_families_within_bf16_of_grouped_mm(empty_table, family):
    model = family_model(family, torch.bfloat16)
    got, want = logits_by(model, torch.randint(0, 128, (1, 7)), ct.NAME, "grouped_mm")
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_gpt_oss_gradients_reach_weights_biases_and_router(empty_table):
    model = family_model("gpt_oss", torch.float32)
    ids = torch.randint(0, 128, (2, 6))
    mlp = model.model.layers[0].mlp
    params = [mlp.experts.gate_up_proj, mlp.experts.gate_up_proj_bias, mlp.experts.down_proj,
              mlp.experts.down_proj_bias, mlp.router.weight]
    grads = {}
    for name in ("grouped_mm", ct.NAME):
        model.zero_grad()
        model.set_experts_implementation(name)
        model(ids).logits.square().mean().backward()
        grads[name] = [p.grad.clone() for p in params]
    for got, want in zip(grads[ct.NAME], grads["grouped_mm"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_moe_block_compiles_fullgraph_before_any_eager_call(empty_table):
    """Guards the layer's plan being read from class and attributes alone under torch.compile."""
    torch._dynamo.reset()
    model = family_model("qwen3_moe", torch.float32, implementation=ct.NAME)
    block = model.model.layers[0].mlp
    x = torch.randn(1, 5, 64)
    got = torch.compile(block, backend="eager", fullgraph=True)(x)
    model.set_experts_implementation("grouped_mm")
    with torch.no_grad():
        torch.testing.assert_close(got.detach(), block(x), rtol=1e-5, atol=1e-5)


def _compiled_ops(fn, *args, calls=None):
    """The ops of the graphs torch.compile traces of fn(*args) (no grad; or of one call per
    argument tuple of `calls`), a sorted list per graph."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend)
    with torch.no_grad():
        for one in calls or [args]:
            compiled(*one)
    return [sorted(str(n.target).split(" at ")[0] for n in g.graph.nodes if n.op in ("call_function", "call_method"))
            for g in graphs]


@pytest.mark.parametrize("family", FAMILIES)
def test_compiled_door_traces_the_same_ops_as_the_direct_call(empty_table, family):
    """Guards the compiled "cutlass_tune" experts running transformers' glue: Dynamo misread the
    gate's qualified name, so the plan traced at the first (compiled) call named no gate."""
    torch.manual_seed(3)
    x, index, weights = torch.randn(6, 64), torch.randint(0, 8, (6, 2)), torch.rand(6, 2)
    door = family_model(family, torch.float32, implementation=ct.NAME).model.layers[0].mlp.experts
    direct = family_model(family, torch.float32).model.layers[0].mlp.experts
    gate_up = direct.gate_up_proj
    biases = dict(gate_up_bias=direct.gate_up_proj_bias, down_bias=direct.down_proj_bias) if direct.has_bias else {}
    activation = "swiglu_oai" if family == "gpt_oss" else direct.config.hidden_act

    def call(h, i, w):
        return cutlass_tune.moe_experts(h, i, w, gate_up, direct.down_proj, table=ct.TABLE_KEY, activation=activation,
                                        transposed=direct.is_transposed, **biases)

    ours = _compiled_ops(lambda h, i, w: door(h, i, w), x, index, weights)
    assert ours == _compiled_ops(call, x, index, weights)
    assert len(ours) == 1 and not any("histc" in op for op in ours[0])


def test_compiled_door_takes_one_graph_for_every_layer(empty_table):
    """Guards the gate's check guarding each module's identity (one recompile per layer)."""
    layers = family_model("qwen3_moe", torch.float32, implementation=ct.NAME).model.layers
    x, index, weights = torch.randn(6, 64), torch.randint(0, 8, (6, 2)), torch.rand(6, 2)
    graphs = _compiled_ops(lambda experts: experts(x, index, weights), calls=[(layer.mlp.experts,) for layer in layers])
    assert len(graphs) == 1 and not any("histc" in op for op in graphs[0])


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_decode_matches_transformers_batched_mm(monkeypatch, family):
    from cutlass_tune.runtime import _moe

    taken = []
    bmm = _moe._bmm
    monkeypatch.setattr(_moe, "_bmm", lambda *a: taken.append(a) or bmm(*a))
    ct.use_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})), decode="batched")
    try:
        model = family_model(family, torch.bfloat16)
        got, want = logits_by(model, torch.randint(0, 128, (1, 3)), ct.NAME, "batched_mm")
    finally:
        ct.use_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})))
    assert len(taken) == 2 * len(model.model.layers)  # both GEMMs of every layer batched
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_use_table_refuses_a_decode_it_does_not_know():
    with pytest.raises(cutlass_tune.runtime.MoEInputError, match="decode 'bmm' is not one of"):
        ct.use_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})), decode="bmm")


def _custom_experts(gate=None, *, has_gate=True, act=None, post_norm=False):
    """A transformers experts module of 4 experts (hidden 16, intermediate 8) with `gate` as its
    `_apply_gate`, running the implementation its `config` names."""
    from transformers.integrations.moe import use_experts_implementation

    class Experts(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.num_experts = 4
            n = 16 if has_gate else 8
            self.gate_up_proj = torch.nn.Parameter(torch.randn(4, n, 16) / 4)
            self.up_proj = self.gate_up_proj
            self.down_proj = torch.nn.Parameter(torch.randn(4, 16, 8) / 4)
            self.act_fn = act or torch.nn.SiLU()
            self.limit = 0.5
            if post_norm:
                self.post_expert_norm = torch.nn.LayerNorm(16)

    if gate is not None:
        Experts._apply_gate = gate
    torch.manual_seed(0)
    cls = use_experts_implementation(Experts, has_gate=has_gate, has_post_expert_norm=post_norm)
    return cls(types.SimpleNamespace(_experts_implementation=ct.NAME))


def _run(experts, implementation, tokens=6):
    torch.manual_seed(1)
    x = torch.randn(tokens, 16)
    index = torch.stack([torch.randperm(4)[:2] for _ in range(tokens)])
    weights = torch.rand(tokens, 2)
    experts.config._experts_implementation = implementation
    with torch.no_grad():
        return experts(x, index, weights)


def _clamp_after_act(self, gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return self.act_fn(gate).clamp(max=self.limit) * up


def test_a_gate_the_layer_does_not_compute_runs_the_glue_and_says_why_once(empty_table):
    experts = _custom_experts(_clamp_after_act)
    with pytest.warns(RuntimeWarning, match="_clamp_after_act is not one the layer computes.*torch glue"):
        got = _run(experts, ct.NAME)
    assert isinstance(experts_plan(experts), str)
    torch.testing.assert_close(got, _run(experts, "grouped_mm"))


def test_a_registered_gate_that_computes_otherwise_is_caught_by_the_probe(empty_table):
    """Guards a transformers release changing a registered gate's math under the same name."""
    def gate(self, gate_up):
        return _clamp_after_act(self, gate_up)

    gate.__module__ = "transformers.models.deepseek_v4.modeling_deepseek_v4"
    gate.__qualname__ = "DeepseekV4Experts._apply_gate"
    experts = _custom_experts(gate)
    with pytest.warns(RuntimeWarning, match="computes otherwise than the layer's"):
        got = _run(experts, ct.NAME)
    torch.testing.assert_close(got, _run(experts, "grouped_mm"))


@pytest.mark.parametrize("case", ["non-gated relu", "post-expert norm"])
def test_non_gated_experts_and_post_expert_norms_run_the_layer(empty_table, case):
    experts = (_custom_experts(has_gate=False, act=torch.nn.ReLU()) if case == "non-gated relu"
               else _custom_experts(post_norm=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = _run(experts, ct.NAME)
    assert isinstance(experts_plan(experts), ExpertsLayout)
    torch.testing.assert_close(got, _run(experts, "grouped_mm"), rtol=1e-5, atol=1e-6)


def test_expert_parallel_sentinels_match_grouped_mm(empty_table):
    experts = _custom_experts()
    experts._is_expert_parallel = True
    x = torch.randn(4, 16)
    index = torch.tensor([[0, 6], [3, 1], [5, 2], [4, 7]])  # 4 and up: other ranks' experts
    weights = torch.rand(4, 2) * (index < 4)
    outs = []
    for name in (ct.NAME, "grouped_mm"):
        experts.config._experts_implementation = name
        with torch.no_grad():
            outs.append(experts(x, index, weights))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)


def test_module_form_from_a_transformers_experts_module(empty_table):
    model = family_model("gpt_oss", torch.float32)
    experts = model.model.layers[0].mlp.experts
    layer = cutlass_tune.nn.MoEExperts.from_experts(experts, ct.TABLE_KEY)
    assert layer.gate_up is experts.gate_up_proj and layer.down_bias is experts.down_proj_bias
    torch.manual_seed(2)
    x, index, weights = torch.randn(5, 64), torch.randint(0, 8, (5, 2)), torch.rand(5, 2)
    with torch.no_grad():
        want = transformers.integrations.moe.grouped_mm_experts_forward(experts, x, index, weights)
        torch.testing.assert_close(layer(x, index, weights), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(cutlass_tune.runtime.MoEInputError, match="_clamp_after_act"):
        cutlass_tune.nn.MoEExperts.from_experts(_custom_experts(_clamp_after_act), ct.TABLE_KEY)


def test_use_table_with_a_model_plans_its_experts_before_compile(monkeypatch):
    """Guards the compiled layers tracing how a plan is made (its gate's name, activation and
    layout: a third more of Dynamo's guards on every call) where use_table was given the model."""
    model = family_model("olmoe", torch.float32, implementation=ct.NAME)
    experts = ct.experts_modules(model)
    assert len(experts) == len(model.model.layers) and all(not hasattr(e, "_cutlass_tune_plan") for e in experts)
    ct.use_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})), model=model)
    assert all(isinstance(experts_plan(e), ExpertsLayout) for e in experts)

    import cutlass_tune.runtime._moe_gates as gates

    traced = []
    monkeypatch.setattr(gates, "experts_activation", lambda e: traced.append(e) or "planned again")
    block = model.model.layers[0].mlp
    x = torch.randn(1, 5, 64)
    torch._dynamo.reset()
    got = torch.compile(block, backend="eager", fullgraph=True)(x)
    assert traced == []  # the kept plan, not a new one
    model.set_experts_implementation("grouped_mm")
    with torch.no_grad():
        torch.testing.assert_close(got.detach(), block(x), rtol=1e-5, atol=1e-5)


def test_use_table_refuses_a_model_that_is_not_a_module():
    with pytest.raises(ct.MoEInputError, match="must be a torch.nn.Module, not str"):
        ct.use_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})), model="qwen3")


def test_the_guard_cost_script_runs_on_the_cpu():
    """benchmarks/guard_cost_cpu.py, whose figures benchmarks/moe_layer.md quotes, still finds one
    cache entry per implementation and times both."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "guard_cost_cpu.py"), "--tokens", "1", "--plan"],
                          capture_output=True, text=True, timeout=600, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "plan given True: guards us a call grouped_mm" in done.stdout and "against batched_mm" in done.stdout


# ---------------------------------------------------------------------------------------------
# The lean traced path: a compiled inference call of a layer planned in eager code


def _lean_taken(monkeypatch):
    """The lean path's choices as traced (None: the full path): a spy run in Python at trace
    time, as `_lean_choice` is (a spy traced into the graph would be guarded itself)."""
    taken = []
    choice = ct._lean_choice

    def spy(*args):
        taken.append(choice(*args))
        return taken[-1]

    monkeypatch.setattr(ct, "_lean_choice", torch.compiler.assume_constant_result(spy))
    return taken


@pytest.mark.parametrize("family", FAMILIES)
def test_a_planned_layer_compiled_for_inference_traces_the_lean_path(monkeypatch, family):
    """Guards the compiled layer reading the plan's fields (Dynamo guards every one on every
    call): planned in eager code, it traces from plain values and computes what grouped_mm does;
    GPT-OSS's biases take the full path."""
    model = family_model(family, torch.float32, implementation=ct.NAME)
    ct.use_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})), model=model)
    taken = _lean_taken(monkeypatch)
    block = model.model.layers[0].mlp
    x = torch.randn(1, 5, 64)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(block, backend="eager", fullgraph=True)(x)
        model.set_experts_implementation("grouped_mm")
        want = block(x)
    got, want = (got[0], want[0]) if isinstance(got, tuple) else (got, want)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if family == "gpt_oss":
        assert taken == []  # its biases: the full path, no choice asked
    else:
        assert len(taken) == 1 and taken[0] is not None
        key, native, glu_runs, experts, transposed, function, form, *_ = taken[0]
        assert (key, native, glu_runs, experts, form) == (ct.TABLE_KEY, False, False, 8, "glu")  # CPU, no GLU row


def test_the_lean_path_leaves_gradients_decode_and_unplanned_layers_to_the_full_path(monkeypatch):
    model = family_model("qwen3_moe", torch.float32, implementation=ct.NAME)
    block = model.model.layers[0].mlp
    x = torch.randn(1, 5, 64)
    ct.use_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})))
    taken = _lean_taken(monkeypatch)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(block, backend="eager", fullgraph=True)(x)
    assert taken == []  # compiled before any eager call and not given to use_table: no plan kept
    ct.use_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})), model=model)
    torch._dynamo.reset()
    out = torch.compile(block, backend="eager", fullgraph=True)(x)
    out = out[0] if isinstance(out, tuple) else out
    out.sum().backward()  # gradients needed: the full path, which has the backward
    assert taken == [] and block.experts.down_proj.grad is not None
    ct.use_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})), decode="batched", model=model)
    try:
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(block, backend="eager", fullgraph=True)(x)
    finally:
        ct.use_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})))
    assert taken == [None]  # the batched GEMMs: the full path's


def test_layers_of_one_shape_share_one_plan_index_and_one_graph(monkeypatch):
    """Guards a per-layer index recompiling each layer that one compiled function calls."""
    model = family_model("qwen3_moe", torch.float32, implementation=ct.NAME)
    ct.use_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})), model=model)
    layers = model.model.layers
    assert len({getattr(layer.mlp.experts, ct._INDEX) for layer in layers}) == 1
    taken = _lean_taken(monkeypatch)
    x, index, weights = torch.randn(6, 64), torch.randint(0, 8, (6, 2)), torch.rand(6, 2)
    graphs = _compiled_ops(lambda experts: experts(x, index, weights), calls=[(layer.mlp.experts,) for layer in layers])
    assert len(graphs) == 1 and len(taken) == 1 and taken[0] is not None


@pytest.mark.parametrize(("activation", "gated"), [("silu", True), ("gelu", True), ("relu", True), ("swiglu_oai", True),
                                                   ("silu", False), ("gelu_tanh", False)])
def test_the_lean_path_computes_the_fused_layer(empty_table, activation, gated):
    """`_lean_call` (traced or not, the same Python) on a planned module against `moe_experts` on
    the same weights, for each activation form; the choice it runs on is plain values."""
    from cutlass_tune.runtime._moe import experts_layout

    torch.manual_seed(4)
    e, h, i = 4, 16, 8
    gate_up, down = torch.randn(e, 2 * i if gated else i, h) / 4, torch.randn(e, h, i) / 4
    x, index, weights = torch.randn(6, h), torch.randint(0, e, (6, 2)), torch.rand(6, 2)
    holder = types.SimpleNamespace(has_gate=gated, has_bias=False, gate_up_proj=gate_up, up_proj=gate_up,
                                   down_proj=down)
    ct._keep_index(holder, experts_layout(gate_up, down, activation, False))
    choice = ct._lean_choice(getattr(holder, ct._INDEX), "grouped", True, -1, torch.float32, torch.int64, 12)
    assert choice[:3] == (ct.TABLE_KEY, False, False)  # the CPU: torch's routing; no GLU row in the empty table
    assert all(isinstance(v, (str, bool, int, float, type(None))) for v in choice)
    with torch.no_grad():
        got = ct._lean_call(holder, x, index, weights)
        want = cutlass_tune.moe_experts(x, index, weights, gate_up, down, table=ct.TABLE_KEY, activation=activation)
    torch.testing.assert_close(got, want)


def test_a_module_with_biases_or_no_plan_keeps_index_minus_one(empty_table):
    """Guards the traced call reading attributes a module may lack (transformers 5.17 has no
    `_is_expert_parallel`): what decides the full path is read once, in eager code."""
    from cutlass_tune.runtime._moe import experts_layout

    gate_up, down = torch.randn(4, 16, 16), torch.randn(4, 16, 8)
    plan = experts_layout(gate_up, down, "silu", False)
    for fields in ({"has_bias": True}, {"has_bias": False, "_is_expert_parallel": True},
                   {"has_bias": False, "has_post_expert_norm": True}):
        holder = types.SimpleNamespace(**fields)
        ct._keep_index(holder, plan)
        assert getattr(holder, ct._INDEX) == -1
    holder = types.SimpleNamespace(has_bias=False)
    ct._keep_index(holder, "its gate is not one the layer computes")
    assert getattr(holder, ct._INDEX) == -1
    holder = types.SimpleNamespace(has_bias=False)
    ct._keep_index(holder, plan)
    assert ct._plans[getattr(holder, ct._INDEX)] == plan


def test_the_lean_path_guards_no_missing_attribute_enum_or_second_torch():
    """Guards the three costly guard kinds the lean path was rid of (benchmarks/moe_layer.md): a
    NO_HASATTR (nn.Module.__getattr__ raising on every check; transformers 5.17's experts lack
    `_is_expert_parallel` and `has_post_expert_norm`), an enum member's guards, and `torch`
    reached through this package's module as well as the model's (an aliasing guard)."""
    model = family_model("qwen3_moe", torch.float32, implementation=ct.NAME)
    experts = model.model.layers[0].mlp.experts
    for name in ("_is_expert_parallel", "has_post_expert_norm"):
        if name in vars(experts):
            delattr(experts, name)
    ct.use_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})), model=model)
    assert getattr(experts, ct._INDEX) >= 0
    torch._dynamo.reset()
    x, index, weights = torch.randn(6, 64), torch.randint(0, 8, (6, 2)), torch.rand(6, 2)

    def call(x, index, weights):
        return experts(x, index, weights)

    with torch.no_grad():
        torch.compile(call, backend="eager", fullgraph=True)(x, index, weights)
    entries = torch._dynamo.eval_frame._debug_get_cache_entry_list(call)
    assert len(entries) == 1
    guards = str(entries[0].guard_manager)
    assert "cutlass_tune_plan_index" in guards  # the one value the traced call reads off the module
    assert "NO_HASATTR" not in guards and "GateForm" not in guards
    assert "cutlass_tune_dot_transformers'].torch" not in guards
