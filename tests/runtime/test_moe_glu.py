"""The gate_up weights of a grouped GLU kernel (cutlass_tune/runtime/_moe_glu.py) on the CPU:
transformers' split gate_up_proj interleaved in blocks of GLU_BLOCK rows gives, through the GLU
node's torch meaning (what the kernel's epilogue computes), act(x Wg^T) * (x Wu^T)."""

import pytest
import torch

from cutlass_tune._torch import apply_nodes
from cutlass_tune.runtime import interleave_gate_up, split_gate_up
from cutlass_tune.runtime._moe import MoEInputError
from cutlass_tune.space import GLU_BLOCK, Activation, Epilogue, Pair


@pytest.mark.parametrize("activation", [Activation.SILU, Activation.GELU_TANH])
def test_interleaved_weights_give_each_expert_s_gated_pair_through_the_glu_node(activation):
    experts, inter, hidden, rows = 3, 40, 24, 11
    torch.manual_seed(0)
    w = torch.randn(experts, 2 * inter, hidden, dtype=torch.float64)
    x = torch.randn(rows, hidden, dtype=torch.float64)
    interleaved = interleave_gate_up(w)
    assert interleaved.shape == w.shape and interleaved.is_contiguous()
    nodes = list(Epilogue(activation=activation, pair=Pair.INTERLEAVED).tree().walk())
    for e in range(experts):
        gate, up = w[e].chunk(2)
        want = {Activation.SILU: torch.nn.functional.silu,
                Activation.GELU_TANH: lambda z: torch.nn.functional.gelu(z, approximate="tanh")}[activation](x @ gate.T)
        got = apply_nodes(nodes, x @ interleaved[e].T, {})
        torch.testing.assert_close(got, want * (x @ up.T), rtol=1e-12, atol=1e-12)


def test_the_layout_is_blocks_of_gate_then_up_rows_and_split_undoes_it():
    w = torch.arange(2 * 4 * GLU_BLOCK, dtype=torch.float32).reshape(1, -1, 1)  # row r holds r
    rows = interleave_gate_up(w).flatten().long().tolist()
    inter = w.shape[1] // 2  # up row j is row inter + j of the split layout
    assert rows[:GLU_BLOCK] == list(range(GLU_BLOCK))  # gate rows 0..7
    assert rows[GLU_BLOCK:2 * GLU_BLOCK] == list(range(inter, inter + GLU_BLOCK))  # up rows 0..7
    assert rows[2 * GLU_BLOCK:3 * GLU_BLOCK] == list(range(GLU_BLOCK, 2 * GLU_BLOCK))  # gate rows 8..15
    assert torch.equal(split_gate_up(interleave_gate_up(w)), w)


@pytest.mark.parametrize(("shape", "says"), [((32, 8), "E x 2I x H"), ((2, 24, 8), str(2 * GLU_BLOCK))])
def test_weights_without_whole_pairs_are_refused_in_one_line(shape, says):
    for fn in (interleave_gate_up, split_gate_up):
        with pytest.raises(MoEInputError, match=says):
            fn(torch.zeros(shape))
