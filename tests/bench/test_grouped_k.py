"""A weight-gradient problem (`Grouping.GROUPED_K`, dW_e = G_e^T X_e) in the bench on the CPU: its
operands, its fp32 reference, the per-expert check (an empty expert's dW_e exactly 0) and torch's
baseline, `torch._grouped_mm(g.t(), x, offs)` as torch's backward computes it."""

import pytest
import torch

from cutlass_tune.bench import Job
from cutlass_tune.bench._targets import GroupedMmTarget, baseline_target, grouped_mm
from cutlass_tune.bench._verify import allocate, randomize, reference, verify_launch
from cutlass_tune.kernel import make_args
from cutlass_tune.measurement import Baseline
from cutlass_tune.space import Grouping, Layout, Problem, Routing, RuntimeArgs
from cutlass_tune.status import Status

# Experts 1 and 3 have no rows; expert 2's 7 rows are fewer than any tile's K.
WGRAD = Problem.experts(4, 32, 48, 40, routing=Routing.HISTOGRAM, group_rows=(33, 0, 7, 0), layout_a=Layout.COL,
                        layout_b=Layout.ROW, grouping=Grouping.GROUPED_K)


def _ops(problem=WGRAD, seed=0):
    ops = allocate(problem, "cpu")
    randomize(ops, torch.Generator().manual_seed(seed))
    return ops


def test_operands_are_g_x_and_one_gradient_per_expert():
    ops = _ops()
    assert ops.a.shape == (40, 32) and ops.b.shape == (40, 48) and ops.d.shape == (4, 32, 48)
    assert ops.a.is_contiguous() and ops.b.is_contiguous()
    assert ops.offsets.dtype == torch.int32 and ops.offsets.tolist() == [33, 33, 40, 40]
    assert ops.a.abs().min() > 0 and ops.b.abs().min() > 0
    # The kernel's arguments: M the routed rows, N and K dW's, the experts and their offsets.
    args = make_args(WGRAD, RuntimeArgs(), a=1, b=2, d=3, offsets=4, device_id=0, sm_count=132)
    assert (args.m, args.n, args.k, args.groups) == (40, 32, 48, 4)


def test_the_reference_is_each_experts_g_transposed_times_x_and_zero_without_rows():
    ops = _ops()
    ref = reference(ops)
    assert ref.shape == (4, 32, 48) and ref.dtype == torch.float32
    g, x = ops.a.float(), ops.b.float()
    assert torch.allclose(ref[0], g[:33].t() @ x[:33])
    assert torch.allclose(ref[2], g[33:].t() @ x[33:])
    assert torch.count_nonzero(ref[1]) == 0 and torch.count_nonzero(ref[3]) == 0


def _check(out):
    ops = _ops()
    ref = reference(ops)

    def launch():
        ops.d.copy_(out(ops, ref))
    return verify_launch(launch, ops, ref)


def test_a_right_gradient_passes():
    verdict = _check(lambda ops, ref: ref)
    assert verdict.status is Status.OK and verdict.rel_error is not None and verdict.rel_error < 1e-2


def test_an_empty_expert_left_unwritten_fails_naming_it():
    """Guards the K = 0 group: CUTLASS gives it tiles with no MMA, and their stores are garbage."""
    def garbage(ops, ref):
        out = ref.clone()
        out[3].fill_(float("nan"))  # as poisoned and never written
        return out
    verdict = _check(garbage)
    assert verdict.status is Status.WRONG_RESULT and verdict.reason.startswith("expert 3 (no rows): 1536 of 1536")


def test_a_wrong_expert_fails_naming_its_rows():
    def off(ops, ref):
        out = ref.clone()
        out[2] *= 1.05
        return out
    verdict = _check(off)
    assert verdict.status is Status.WRONG_RESULT and verdict.reason.startswith("expert 2 (rows 33:40)")


def test_the_baseline_is_torch_grouped_mm_alone():
    assert Baseline.of(WGRAD) is Baseline.GROUPED_MM
    assert not Baseline.EXPERT_LOOP.applies(WGRAD) and not Baseline.DENSE.applies(WGRAD)
    assert Baseline.EXPERT_LOOP.applies(Problem.experts(4, 32, 48, 40))
    assert isinstance(baseline_target(WGRAD, Baseline.GROUPED_MM), GroupedMmTarget)
    assert Job.baseline(WGRAD).symbol == "torch._grouped_mm"


@pytest.mark.skipif(grouped_mm() is None, reason="this torch has no grouped GEMM")
def test_torch_grouped_mm_of_g_transposed_and_x_computes_the_reference():
    ops = _ops()
    ref = reference(ops)
    target = GroupedMmTarget(WGRAD)
    assert target.setup(RuntimeArgs(), ops) is None
    verdict = target.check(ops, ref)
    assert verdict.status is Status.OK, verdict.reason
