"""cutlass_tune.inductor_options on the CPU: which GEMMs of a compiled graph the post-grad pass
rewrites into torch.ops.cutlass_tune.linear (the operator's calls counted), why it leaves the
rest, and that the compiled result equals eager."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlass_tune
from cutlass_tune.runtime import FusionPass, register_table
from cutlass_tune.runtime._patch import operator_takes

from .fusion_tables import fused_table

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
LINEAR = torch.ops.cutlass_tune.linear.default
ACTS = {"gelu": nn.GELU(), "gelu_tanh": nn.GELU(approximate="tanh"), "relu": nn.ReLU(), "silu": nn.SiLU()}
needs_gate = pytest.mark.skipif(not operator_takes("gate"), reason="cutlass_tune.linear has no gate argument here")
needs_residual = pytest.mark.skipif(not operator_takes("residual"),
                                    reason="cutlass_tune.linear has no residual argument here")


@pytest.fixture(autouse=True)
def _fresh_compile():
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        yield


@pytest.fixture
def calls(monkeypatch):
    """The cutlass_tune.linear calls compiled code makes, by activation (the CPU kernel counted)."""
    seen: list[str] = []
    from cutlass_tune.runtime import _op

    cpu = _op._linear_cpu

    def counted(x, weight, bias, activation, table, *args, **kwargs):
        seen.append(activation)
        return cpu(x, weight, bias, activation, table, *args, **kwargs)

    monkeypatch.setattr(_op, "_linear_cpu", counted)
    torch.library.register_kernel("cutlass_tune::linear", "cpu", counted)
    yield seen
    torch.library.register_kernel("cutlass_tune::linear", "cpu", cpu)


def _compiled(model, table, x, **options):
    opts = cutlass_tune.inductor_options(table, cuda_only=False, **options)
    with torch.no_grad():
        out = torch.compile(model, options=opts)(x)
        want = model(x)
    return out, want, opts["post_grad_custom_post_pass"]


@pytest.mark.parametrize("name", list(ACTS))
def test_a_linear_and_its_activation_become_one_call_equal_to_eager(name, calls):
    table = register_table(fused_table([(f"bias+{name}", 64, 32, 1.2)]))
    model = nn.Sequential(nn.Linear(32, 64, dtype=torch.bfloat16), ACTS[name], nn.Linear(64, 16, dtype=torch.bfloat16))
    x = torch.randn(2, 5, 32, dtype=torch.bfloat16)
    out, want, fusion = _compiled(model, table, x)
    assert calls == [name]
    assert sorted((d.epilogue, d.fused) for d in fusion.decisions) == [("bias", False), (f"bias+{name}", True)]
    torch.testing.assert_close(out, want, rtol=1.6e-2, atol=2e-2)


def test_dynamic_tokens_still_match_and_the_rest_is_left_with_its_reason(calls):
    table = register_table(fused_table([("bias+gelu", 64, 32, 1.2), ("bias+gelu", 16, 64, 0.9)]))
    model = nn.Sequential(nn.Linear(32, 64, dtype=torch.bfloat16), nn.GELU(), nn.Linear(64, 16, dtype=torch.bfloat16),
                          nn.GELU())
    x = torch.randn(3, 7, 32, dtype=torch.bfloat16)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.mark_dynamic(x, 1)
    out, want, fusion = _compiled(model, table, x)
    assert calls == ["gelu"]
    left = [d for d in fusion.decisions if not d.fused and d.epilogue == "bias+gelu"]
    assert [str(d) for d in left] == ["left   bf16 bias+gelu N=16 K=64: bf16 tn bias+gelu N=16, K=64: tuned at 0.900x "
                                      "torch at best, below min_ratio 1.0 (torch's path is kept)"]
    torch.testing.assert_close(out, want, rtol=1.6e-2, atol=2e-2)


def test_a_kernel_shorter_than_a_calls_host_time_is_left_unless_asked(calls):
    # Guards against the pass slowing a host-bound graph (BERT-large, 8192 tokens: 0.57x with
    # its 29-140 us GEMMs fused): the operator's dispatch and Python path cost about that much.
    table = register_table(fused_table([("bias+gelu", 64, 32, 1.2)], median_ms=0.12))
    model = nn.Sequential(nn.Linear(32, 64, dtype=torch.bfloat16), nn.GELU())
    x = torch.randn(2, 5, 32, dtype=torch.bfloat16)
    out, want, fusion = _compiled(model, table, x)
    assert calls == []
    assert [str(d) for d in fusion.decisions if d.epilogue == "bias+gelu"] == [
        "left   bf16 bias+gelu N=64 K=32: bf16 tn bias+gelu N=64, K=32: its kernel takes 120 us at M = 128, under "
        "min_kernel_us 150, the host time of a call (torch's path is kept; under CUDA graphs the host drops out: "
        "pass min_kernel_us=0)"]
    torch._dynamo.reset()
    out, want, fusion = _compiled(model, table, x, min_kernel_us=0)
    assert calls == ["gelu"]
    torch.testing.assert_close(out, want, rtol=1.6e-2, atol=2e-2)


def test_an_activation_whose_input_is_also_read_is_not_fused(calls):
    table = register_table(fused_table([("silu", 64, 32, 1.2)]))
    lin = nn.Linear(32, 64, bias=False, dtype=torch.bfloat16)
    x = torch.randn(4, 32, dtype=torch.bfloat16)

    def both(t):
        z = lin(t)
        return F.silu(z) + z.sum()

    out, want, fusion = _compiled(both, table, x)
    assert calls == [] and not any(d.fused for d in fusion.decisions)
    torch.testing.assert_close(out, want, rtol=1.6e-2, atol=2e-2)


def test_a_training_graph_keeps_its_pre_activation(calls):
    table = register_table(fused_table([("bias+gelu", 64, 32, 1.2)]))
    model = nn.Sequential(nn.Linear(32, 64, dtype=torch.bfloat16), nn.GELU())
    compiled = torch.compile(model, options=cutlass_tune.inductor_options(table, cuda_only=False))
    compiled(torch.randn(4, 32, dtype=torch.bfloat16)).sum().backward()
    assert calls == [] and model[0].weight.grad is not None


def test_off_cuda_it_leaves_everything_by_default(calls):
    table = register_table(fused_table([("bias+relu", 64, 32, 1.2)]))
    model = nn.Sequential(nn.Linear(32, 64, dtype=torch.bfloat16), nn.ReLU())
    opts = cutlass_tune.inductor_options(table)
    with torch.no_grad():
        torch.compile(model, options=opts)(torch.randn(4, 32, dtype=torch.bfloat16))
    assert calls == []
    decisions = opts["post_grad_custom_post_pass"].decisions
    assert {d.epilogue for d in decisions} == {"bias+relu", "bias"}  # the fused site, then the bias alone
    assert {d.reason for d in decisions} == {"on cpu: the tuned kernels run on CUDA"}


def test_the_cache_key_follows_the_table():
    one = FusionPass(register_table(fused_table([("bias+relu", 64, 32, 1.2)])))
    two = FusionPass(register_table(fused_table([("bias+relu", 64, 32, 1.3)])))
    assert one.uuid() == FusionPass(one.key).uuid() != two.uuid()


class GatedMLP(nn.Module):
    def __init__(self, hidden=32, inner=64):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False, dtype=torch.bfloat16)
        self.up_proj = nn.Linear(hidden, inner, bias=False, dtype=torch.bfloat16)
        self.down_proj = nn.Linear(inner, hidden, bias=False, dtype=torch.bfloat16)

    def forward(self, x):
        return x + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@needs_gate
@needs_residual
def test_a_gated_mlp_fuses_its_product_and_its_residual(calls):
    table = register_table(fused_table([("silu+gated", 64, 32, 1.2), ("residual", 32, 64, 1.1)]))
    x = torch.randn(2, 3, 32, dtype=torch.bfloat16)
    out, want, fusion = _compiled(GatedMLP(), table, x)
    assert sorted(calls) == ["none", "silu"]
    assert {d.epilogue for d in fusion.decisions if d.fused} == {"silu+gated", "residual"}
    torch.testing.assert_close(out, want, rtol=1.6e-2, atol=3e-2)


def test_a_gated_mlp_without_entries_is_left_as_inductor_compiles_it(calls):
    table = register_table(fused_table([("bias+relu", 64, 32, 1.2)]))
    x = torch.randn(2, 3, 32, dtype=torch.bfloat16)
    out, want, fusion = _compiled(GatedMLP(), table, x)
    assert calls == []
    assert {d.epilogue for d in fusion.decisions} >= {"silu+gated", "residual"}
    torch.testing.assert_close(out, want, rtol=1.6e-2, atol=3e-2)
