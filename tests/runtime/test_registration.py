"""How a call of each operator (`_registration.define`) goes through the dispatcher: straight to
its device's kernel where no gradient is needed, through its autograd.Function where one is,
redispatched where a fake tensor or a dispatch mode must see it; on the CPU (its CUDA kernel is
reached the same way) and on a GPU."""

import pandas as pd
import pytest
import torch
from torch._dynamo.utils import counters
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from cutlass_tune.runtime import BestTable, register_table
from cutlass_tune.runtime._registration import KERNELS

OPS = {"mm": torch.ops.cutlass_tune.mm.default, "linear": torch.ops.cutlass_tune.linear.default,
       "grouped_mm": torch.ops.cutlass_tune.grouped_mm.default}


@pytest.fixture(scope="module")
def key():
    return register_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})), key="registration")


def arguments(name, key, device="cpu", grad=False):
    """A call's arguments for operator `name`; its tensors require grad with `grad`."""
    torch.manual_seed(0)

    def t(*shape, dtype=torch.float32):
        return torch.randn(*shape, dtype=dtype, device=device, requires_grad=grad)

    if name == "mm":
        return t(4, 8), t(8, 6), key
    if name == "linear":
        return t(4, 8), t(6, 8), t(6), "relu", key
    offs = torch.tensor([2, 2, 5, 8], dtype=torch.int32, device=device)
    return t(8, 16, dtype=torch.bfloat16), t(4, 16, 8, dtype=torch.bfloat16), offs, key


class Path:
    """What a call did: the autograd.Functions it entered, its redispatches below autograd, and
    its kernel's calls."""

    def __init__(self, monkeypatch, name, device):
        self.functions, self.redispatches, self.kernel_calls = [], 0, 0
        apply = torch.autograd.Function.apply.__func__
        op, kernel = OPS[name], KERNELS[name][device]

        def entered(cls, *args, **kwargs):
            self.functions.append(cls.__name__)
            return apply(cls, *args, **kwargs)

        def redispatched(*args, **kwargs):
            self.redispatches += 1
            return type(op).redispatch(op, *args, **kwargs)

        def counted(*args):
            self.kernel_calls += 1
            return kernel(*args)

        monkeypatch.setattr(torch.autograd.Function, "apply", classmethod(entered))
        monkeypatch.setattr(op, "redispatch", redispatched)
        monkeypatch.setitem(KERNELS[name], device, counted)


@pytest.mark.parametrize("grad_mode", ["no_grad", "grad on, no input requiring it"])
@pytest.mark.parametrize("name", list(OPS))
def test_a_call_needing_no_gradient_goes_straight_to_its_kernel(key, monkeypatch, name, grad_mode):
    args = arguments(name, key)
    want = KERNELS[name]["cpu"](*args)
    path = Path(monkeypatch, name, "cpu")
    with torch.set_grad_enabled(grad_mode != "no_grad"):
        got = OPS[name](*args)
    assert (path.functions, path.redispatches, path.kernel_calls) == ([], 0, 1)
    assert torch.equal(got, want) and not got.requires_grad


@pytest.mark.parametrize("name", list(OPS))
def test_a_call_needing_a_gradient_runs_the_operator_s_autograd_function(key, monkeypatch, name):
    args = arguments(name, key, grad=True)
    path = Path(monkeypatch, name, "cpu")
    out = OPS[name](*args)
    assert (path.functions, path.kernel_calls) == ([f"cutlass_tune_{name}"], 1)
    assert out.grad_fn is not None


@pytest.mark.parametrize("name", list(OPS))
def test_inference_mode_reaches_the_kernel_without_the_autograd_kernel(key, monkeypatch, name):
    args = arguments(name, key)
    path = Path(monkeypatch, name, "cpu")
    with torch.inference_mode():
        OPS[name](*args)
    assert (path.functions, path.redispatches, path.kernel_calls) == ([], 0, 1)


class _Seen(TorchDispatchMode):
    """The operators called under it."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", list(OPS))
def test_a_dispatch_mode_and_fake_tensors_see_the_operator_as_one_call(key, monkeypatch, name):
    """Guards the direct path: it must not hide the operator from tracing (a mode below autograd)."""
    args = arguments(name, key)
    path = Path(monkeypatch, name, "cpu")
    with _Seen() as seen:
        OPS[name](*args)
    assert OPS[name] in seen.ops and path.redispatches == 1 and path.kernel_calls == 1
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        out = OPS[name](*fake)
    assert path.kernel_calls == 1 and out.shape == KERNELS[name]["cpu"](*args).shape  # the fake kernel ran


@pytest.mark.parametrize("name", list(OPS))
def test_a_compiled_call_reaches_the_kernel_directly(key, monkeypatch, name):
    args = arguments(name, key)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    rest = args[len(tensors):]
    torch._dynamo.reset()
    compiled = torch.compile(lambda *t: OPS[name](*t, *rest), backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        compiled(*tensors)  # traced here
        path = Path(monkeypatch, name, "cpu")
        got = compiled(*tensors)
    assert (path.functions, path.redispatches, path.kernel_calls) == ([], 0, 1)
    assert torch.equal(got, OPS[name](*args))


@pytest.mark.parametrize("name", list(OPS))
def test_a_frame_dynamo_runs_eagerly_calls_the_operator_without_tracing_into_its_kernel(key, name):
    """Guards the Dynamo-disabled kernels: Dynamo must not compile the kernel's Python."""
    args = arguments(name, key)

    def call():
        return OPS[name](*args)

    eager = torch._dynamo.disable(call, recursive=False)  # run eagerly, Dynamo still on for its callees
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        got = torch.compile(lambda: eager() + 1, backend="eager")()
    assert counters["stats"]["unique_graphs"] == 1  # the lambda's `+ 1` alone
    assert torch.equal(got, call() + 1)


def test_every_operator_keeps_its_tags():
    for op in OPS.values():
        assert torch.Tag.pt2_compliant_tag in op.tags
        if hasattr(torch.Tag, "needs_exact_strides"):
            assert torch.Tag.needs_exact_strides in op.tags


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(OPS))
def test_a_cuda_call_needing_no_gradient_goes_straight_to_its_kernel(key, monkeypatch, name):
    """Guards the CUDA keyset of the direct path (a plain CUDA tensor's, as the dispatcher hands
    it to the Autograd kernel): a miss would cost a redispatch per call."""
    args = arguments(name, key, device="cuda")
    monkeypatch.setitem(KERNELS[name], "cuda", KERNELS[name]["cpu"])  # torch's math: no tuned kernel needed
    path = Path(monkeypatch, name, "cuda")
    with torch.no_grad():
        OPS[name](*args)
    assert (path.functions, path.redispatches, path.kernel_calls) == ([], 0, 1)
