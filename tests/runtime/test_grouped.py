"""torch.ops.cutlass_tune.grouped_mm on the CPU, where torch's grouped GEMM computes it: its
checks, fake (meta) implementation, autograd and torch.compile without a graph break. The tuned
kernels run in test_grouped_gpu.py."""

import pandas as pd
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cutlass_tune
from cutlass_tune.runtime import BestTable, MatmulInputError, UnregisteredTableError, register_table

E, N, K = 4, 16, 32
OFFS = (5, 5, 12, 24)  # expert 1 gets no rows


@pytest.fixture(scope="module")
def key():
    return register_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})), key="grouped-cpu")


def operands(layout="tn", dtype=torch.bfloat16, grad=False):
    torch.manual_seed(0)
    a = torch.randn(OFFS[-1], K, dtype=dtype, requires_grad=grad)
    if layout == "tn":
        w = torch.randn(E, N, K, dtype=dtype, requires_grad=grad)
        b = w.transpose(-2, -1)
    else:
        w = torch.randn(E, K, N, dtype=dtype, requires_grad=grad)
        b = w
    return a, w, b, torch.tensor(OFFS, dtype=torch.int32)


@pytest.mark.parametrize("layout", ["tn", "tt"])
def test_equals_torch_grouped_mm(key, layout):
    a, _, b, offs = operands(layout)
    torch.testing.assert_close(torch.ops.cutlass_tune.grouped_mm(a, b, offs, key), torch._grouped_mm(a, b, offs),
                               rtol=0, atol=0)


def test_out_dtype(key):
    a, _, b, offs = operands()
    out = torch.ops.cutlass_tune.grouped_mm(a, b, offs, key, torch.float32)
    assert out.dtype == torch.float32 and out.shape == (OFFS[-1], N)
    torch.testing.assert_close(out, torch._grouped_mm(a, b, offs).float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("layout", ["tn", "tt"])
def test_backward_equals_torch(key, layout):
    a, w, b, offs = operands(layout, dtype=torch.float32, grad=True)
    grad = torch.randn(OFFS[-1], N)
    torch.ops.cutlass_tune.grouped_mm(a, b, offs, key).backward(grad)
    got = a.grad.clone(), w.grad.clone()
    a.grad = w.grad = None
    torch._grouped_mm(a, b, offs).backward(grad)
    torch.testing.assert_close(got[0], a.grad)
    torch.testing.assert_close(got[1], w.grad)
    assert not got[1][1].any()  # the expert of no rows gets no gradient


def test_weight_gradient_keeps_the_weights_layout(key):
    """Guards dW of an E x N x K weight stack landing E x N x K row-major (no transposed copy)."""
    a, w, b, offs = operands("tn", dtype=torch.float32, grad=True)
    torch.ops.cutlass_tune.grouped_mm(a, b, offs, key).sum().backward()
    assert w.grad.is_contiguous()


def test_compiles_with_no_graph_break(key):
    a, _, b, offs = operands()
    compiled = torch.compile(lambda a, b, offs: torch.ops.cutlass_tune.grouped_mm(a, b, offs, key) * 2,
                             fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(a, b, offs), torch._grouped_mm(a, b, offs) * 2, rtol=0, atol=0)


def test_fake_tensors_give_the_shape_and_dtype(key):
    with FakeTensorMode():
        a = torch.empty(100, K, dtype=torch.bfloat16)
        b = torch.empty(E, N, K, dtype=torch.bfloat16).transpose(-2, -1)
        offs = torch.empty(E, dtype=torch.int32)
        out = torch.ops.cutlass_tune.grouped_mm(a, b, offs, key, torch.float32)
    assert out.shape == (100, N) and out.dtype == torch.float32


@pytest.mark.parametrize(("change", "message"), [
    (lambda a, b, o: (a, b, o.long()), "offs must be 4 int32 row ends"),
    (lambda a, b, o: (a, b, o[:3]), "offs must be 4 int32 row ends"),
    (lambda a, b, o: (a[:, :16], b, o), "do not multiply"),
    (lambda a, b, o: (a.half(), b, o), "they must match"),
    (lambda a, b, o: (a, b[0], o), "b must be 3-D"),
    (lambda a, b, o: (a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn), o), "the operator takes no fp8 scales"),
])
def test_bad_operands_are_one_line_errors(key, change, message):
    a, _, b, offs = operands()
    with pytest.raises(RuntimeError, match=message) as err:
        torch.ops.cutlass_tune.grouped_mm(*change(a, b, offs), key)
    assert "\n" not in str(err.value).strip()


def test_unregistered_key(key):
    a, _, b, offs = operands()
    with pytest.raises(UnregisteredTableError, match="no table is registered under 'nope'"):
        torch.ops.cutlass_tune.grouped_mm(a, b, offs, "nope")


def test_grouped_mm_needs_cuda_tensors():
    a, _, b, offs = operands()
    with pytest.raises(MatmulInputError, match="a is on cpu: the tuned kernels run on a CUDA device"):
        cutlass_tune.grouped_mm(a, b, offs, table=BestTable(pd.DataFrame({"m": [], "n": [], "k": []})))


@pytest.mark.parametrize("which", ["a", "offs"])
def test_a_list_for_a_or_offs_is_a_one_line_error(which):
    """Guards grouped_mm given a Python list raising AttributeError (it read .get_device() first)."""
    a, _, b, offs = operands()
    given = {"a": a, "offs": offs, which: [1, 2]}
    with pytest.raises(MatmulInputError, match=f"^{which} must be a torch.Tensor, not list$"):
        cutlass_tune.grouped_mm(given["a"], b, given["offs"],
                                table=BestTable(pd.DataFrame({"m": [], "n": [], "k": []})))


def test_block_wise_grouped_scales_say_k_must_be_a_multiple_of_128():
    """Guards a K that is not whole 128-groups being reported only as a shape mismatch."""
    from cutlass_tune.runtime._grouped import grouped_scales

    m, k, e, n = 8, 208, 2, 128
    a = torch.zeros(m, k).to(torch.float8_e4m3fn)
    b = torch.zeros(e, n, k).to(torch.float8_e4m3fn).transpose(-2, -1)
    with pytest.raises(MatmulInputError, match=r"scale_a has shape \(8, 1\); block-wise it must be \(8, 2\).*"
                                               r"K 208 is not a multiple of 128"):
        grouped_scales(a, b, torch.ones(m, k // 128), torch.ones(e, 1, k // 128))
    with pytest.raises(MatmulInputError, match=r"^scale_b has shape \(2, 3, 2\).*block-wise.*not a multiple of 128"):
        grouped_scales(a, b, torch.ones(m, 2), torch.ones(e, 3, 2))


class OnCuda(torch.Tensor):
    """A CPU tensor that says it is on cuda:0 (grouped_problem_of reads `device`)."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def test_no_routed_rows_pose_a_problem_of_m_0():
    """Guards grouped_problem_of refusing M = 0 (an expert-parallel rank given no tokens) where torch
    returns an empty (0, N) result."""
    from cutlass_tune.runtime._grouped import grouped_problem_of

    a, _, b, offs = operands()
    empty = a[:0].contiguous().as_subclass(OnCuda)
    problem = grouped_problem_of(empty, b.as_subclass(OnCuda), torch.zeros_like(offs).as_subclass(OnCuda))
    assert (problem.m, problem.n, problem.k, problem.groups) == (0, b.shape[2], b.shape[1], b.shape[0])


@pytest.mark.parametrize("layout", ["tn", "tt"])
def test_double_backward_equals_torch(key, layout):
    """Guards the gradient of the weight gradient (create_graph): the operator's own backward."""
    a, w, b, offs = operands(layout, dtype=torch.float32, grad=True)
    grad = torch.randn(OFFS[-1], N, requires_grad=True)

    def second(mm):
        (dw,) = torch.autograd.grad(mm(a, b, offs), w, grad, create_graph=True)
        return torch.autograd.grad(dw.square().sum(), (a, grad))

    got = second(lambda a, b, offs: torch.ops.cutlass_tune.grouped_mm(a, b, offs, key))
    want = second(torch._grouped_mm)
    for g, t in zip(got, want):
        torch.testing.assert_close(g[:OFFS[-1]], t[:OFFS[-1]])


def test_the_compiled_backward_runs_the_weight_gradient_operator(key):
    """Guards dB under AOTAutograd: the backward graph holds grouped_weight_grad, and its gradients are eager's."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    a, w, b, offs = operands("tn", dtype=torch.float32, grad=True)
    compiled = torch.compile(lambda a, w, offs: torch.ops.cutlass_tune.grouped_mm(a, w.transpose(-2, -1), offs, key),
                             fullgraph=True, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))
    compiled(a, w, offs).square().sum().backward()
    got = a.grad.clone(), w.grad.clone()
    a.grad = w.grad = None
    torch.ops.cutlass_tune.grouped_mm(a, b, offs, key).square().sum().backward()
    torch.testing.assert_close(got[0], a.grad)
    torch.testing.assert_close(got[1], w.grad)
    backward = graphs[-1].code
    assert "cutlass_tune.grouped_weight_grad" in backward and "aten._grouped_mm" not in backward
