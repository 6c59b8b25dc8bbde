import pytest
import torch

from cutlass_tune.bench import _targets, _verify
from cutlass_tune.space import DType, Problem, Scaling
from tests.test_kinds import KINDS


@pytest.mark.parametrize("registry", [_verify.REFERENCES, _verify.GROUPINGS, _verify.SCALES, _verify.FILLS],
                         ids=lambda r: r.stage)
def test_every_kind_has_operands_and_a_reference(registry):
    assert all(kind in registry for kind in KINDS)


@pytest.mark.parametrize("registry", [_targets.GROUPED_MM_CALLS, _targets.EXPERT_GEMMS], ids=lambda r: r.stage)
def test_every_grouped_kind_has_its_baselines(registry):
    assert all(kind in registry for kind in KINDS if kind.grouped)


def test_each_kind_gets_its_operands_and_reference():
    """A grouped block-wise problem's scales are K-major per expert, a dense one's M-major; the
    reference of each multiplies them in."""
    fp8 = {"dtype_a": DType.E4M3, "dtype_b": DType.E4M3, "dtype_d": DType.BF16, "scaling": Scaling.BLOCKWISE}
    grouped = Problem.experts(2, 256, 256, 64, **fp8)
    dense = Problem(64, 256, 256, **fp8)
    for problem in (grouped, dense):
        ops = _verify.allocate(problem, "cpu")
        _verify.randomize(ops, torch.Generator().manual_seed(0))
        assert torch.isfinite(_verify.reference(ops)).all()
    ops = _verify.allocate(grouped, "cpu")
    assert ops.b.shape == (2, 256, 256) and ops.offsets is not None and ops.scale_b.shape == (2, 2, 2)
    assert _verify.allocate(dense, "cpu").scale_a.stride() == (1, 64)
