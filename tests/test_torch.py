"""The enums' torch counterparts: complete, inverse of each other, and true to torch's own ops."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cutlass_tune._torch import ACTIVATION, ACTIVATION_GRAD, DTYPE_OF, FP8_DTYPES, TORCH_DTYPE, activation_of_op
from cutlass_tune.space import Activation, DType


def test_every_dtype_maps_to_torch_and_back():
    assert set(TORCH_DTYPE) == set(DType)
    assert {DTYPE_OF[t] for t in TORCH_DTYPE.values()} == set(DType)
    assert all(DTYPE_OF[TORCH_DTYPE[d]] is d for d in DType)
    assert FP8_DTYPES == {torch.float8_e4m3fn, torch.float8_e5m2}


@pytest.mark.parametrize("activation", [a for a in Activation if a is not Activation.NONE])
def test_each_gradient_is_autograd_of_its_activation(activation):
    z = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    grad = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (want,) = torch.autograd.grad(ACTIVATION[activation](z), z, grad)
    assert torch.allclose(ACTIVATION_GRAD[activation](grad, z.detach()), want)


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append((func.overloadpacket.__name__, kwargs or {}))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("activation", list(Activation))
def test_the_op_an_activation_runs_reads_back_as_it(activation):
    # What capture relies on: a model's F.gelu(approximate="tanh") is recorded as GELU_TANH.
    x = torch.randn(8)
    with _Ops() as ops:
        ACTIVATION[activation](x)
    found = [activation_of_op(op, kwargs.get("approximate", "none")) for op, kwargs in ops.seen]
    assert found == ([] if activation is Activation.NONE else [activation])


def test_other_ops_are_no_activation():
    assert activation_of_op("mm") is None and activation_of_op("gelu_backward") is None
    assert activation_of_op("relu_") is Activation.RELU
