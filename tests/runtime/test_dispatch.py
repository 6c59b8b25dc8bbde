"""The runtime dispatcher on the CPU: `resolve` (table lookup, nearest problem, min_ratio, the
fallback and its reason), `PlanCache`, and the one eager-direct decision of every door. CUDA
devices are faked by name (`torch.cuda.get_device_name`), loaded kernels by a stand-in."""

import ctypes
import json
import math
import threading
import warnings

import pandas as pd
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import cutlass_tune
from cutlass_tune.kernel import GemmArgs, KernelStatusError
from cutlass_tune.runtime import (
    BestTable,
    Call,
    FallbackReason,
    Kind,
    Plan,
    PlanCache,
    Ready,
    Workspace,
    _dispatch,
    _linear,
    _matmul,
    eager_direct_allowed,
    resolve,
)
from cutlass_tune.space import DType, KernelConfig, Layout, Problem
from cutlass_tune.tables import BundledKernel

from .tables import csv_table

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


class CudaLooking(torch.Tensor):
    """A CPU tensor that says it is on CUDA: the doors' decision reads `is_cuda`."""

    @property
    def is_cuda(self):
        return True


class FakeKernel:
    """Stands for `LoadedKernel`: the entry point a plan asks (workspace_size)."""

    loads = 0

    def __init__(self, library, symbol):
        self.library, self.symbol = library, symbol
        FakeKernel.loads += 1

    def workspace_size(self, args):
        return 256


@pytest.fixture
def gpu(monkeypatch):
    """Pretend CUDA device names (`gpu[index] = name`) of 132 SMs; kernels load as `FakeKernel`s."""
    names = {0: H200}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: names[device])
    monkeypatch.setattr(_dispatch, "_warned", set())
    monkeypatch.setattr(_matmul, "LoadedKernel", FakeKernel)
    monkeypatch.setattr(_matmul, "sm_count", lambda device: 132)
    FakeKernel.loads = 0
    _dispatch.clear_loaded()
    yield names
    _dispatch.clear_loaded()


@pytest.fixture
def table(tmp_path):
    """bf16 tn 128x64x32 and 4096x64x32, tuned on an H200 at ratio 1.2 and 0.9."""
    t = csv_table(tmp_path / "best.csv", [("bf16", "tn", 128, 64, 32), ("bf16", "tn", 4096, 64, 32)])
    t.frame["ratio"] = [1.2, 0.9]
    t.bundled = {h: BundledKernel(f"/bundle/kernels/{h}.so", "k0") for h in t.frame["config_hash"]}
    return t


def call(m=128, n=64, k=32, dtype=DType.BF16, min_ratio=1.0, device=0):
    problem = Problem(m, n, k, dtype_a=dtype, dtype_b=dtype, dtype_d=dtype, layout_a=Layout.ROW,
                      layout_b=Layout.COL)
    return Call(Kind.DENSE, problem, device, min_ratio, (device, m, n, k, dtype, min_ratio))


def test_an_exact_row_above_min_ratio_plans_its_kernel_as_plain_data(gpu, table):
    plan = resolve(table, call())
    assert plan.fallback is None and plan.exact and plan.ratio == pytest.approx(1.2)
    row = table.frame.iloc[0]
    assert plan.kernel.library == f"/bundle/kernels/{row['config_hash']}.so" and plan.kernel.symbol == "k0"
    assert plan.kernel.config_hash == KernelConfig.from_dict(json.loads(row["config"])).hash
    assert len(plan.args) == ctypes.sizeof(GemmArgs)
    args = GemmArgs.from_buffer_copy(plan.args)
    assert (args.m, args.n, args.k, args.sm_count, args.device_id) == (128, 64, 32, 132, 0)
    assert not (args.a or args.b or args.c or args.d or args.bias)  # no addresses
    assert (plan.workspace, plan.workspace_bytes) == (Workspace.KEPT, 256)


def test_a_problem_not_tuned_runs_the_nearest_rows_kernel(gpu, table):
    plan = resolve(table, call(m=256))
    assert plan.kernel is not None and not plan.exact and plan.ratio == pytest.approx(1.2)


def test_a_table_of_no_columns_is_torch_s_path_everywhere_not_a_key_error(gpu):
    """Regression: `BestTable(pd.DataFrame())` (what benchmarks/tune_model_fp8.py registers for
    a plain forward) raised KeyError 'dtype_a' on a CUDA call's lookup: the fp8 model's GPU test
    failed on it twice. No columns is no rows: torch's path, said once."""
    empty = BestTable(pd.DataFrame())
    plan = resolve(empty, call())
    assert plan.kernel is None and plan.fallback.reason is FallbackReason.NO_ROW
    assert plan.fallback.detail == "no tuned problem for bf16 -> bf16 tn (the table has: none)"
    grouped = Problem.experts(8, 64, 32, 100, layout_b=Layout.COL)
    plan = resolve(empty, Call(Kind.GROUPED, grouped, 0, 1.0, ("g",)))
    assert plan.fallback.reason is FallbackReason.NO_ROW and "(the table has: none)" in plan.fallback.detail


@pytest.mark.parametrize(("min_ratio", "runs"), [(1.0, False), (0.8, True), (0.0, True)])
def test_a_row_below_min_ratio_falls_back_with_its_ratio(gpu, table, min_ratio, runs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plans = [resolve(table, call(m=4096, min_ratio=min_ratio)) for _ in range(2)]
    if runs:
        assert plans[0].kernel is not None and plans[0].fallback is None and not caught
        return
    fallback = plans[0].fallback
    assert plans[0].kernel is None and fallback.reason is FallbackReason.BELOW_MIN_RATIO
    assert fallback.ratio == pytest.approx(0.9) and "0.900x" in fallback.detail and fallback.path == "torch.matmul"
    assert [str(w.message) for w in caught] == [f"cutlass_tune.matmul: {fallback.detail}; using torch.matmul"]
    assert FakeKernel.loads == 0  # nothing loaded for a kernel that does not run


def test_a_call_site_ratio_below_the_claim_keeps_the_kernel_off(gpu, table):
    """Guards against a table entry that claims 1.01 but delivers 0.97 at the call site running
    under min_ratio 1.0 (the fp8 rows of issue 46)."""
    table.frame["ratio"] = [1.01, 0.9]
    table.frame["call_site_ratio"] = [0.97, float("nan")]
    table.frame["call_site_regime"] = ["sustained", ""]
    with pytest.warns(RuntimeWarning) as caught:
        plan = resolve(table, call())
    assert plan.kernel is None and plan.fallback.reason is FallbackReason.BELOW_MIN_RATIO
    assert plan.ratio == pytest.approx(0.97)
    message = str(caught[0].message)
    assert "0.970x torch at the call site (sustained) (its claim 1.010), below min_ratio 1.0" in message
    assert resolve(table, call(min_ratio=0.95)).kernel is not None  # 0.97 clears a lower bar


@pytest.mark.parametrize(("in_model", "call_site", "regime", "want"), [
    (1.08, 0.97, 1.20, 1.08),                   # the in-model figure first
    (float("nan"), 1.04, 0.90, 1.04),           # else the call site's, even above a regime's
    (float("nan"), 11.9, 0.90, 1.2),            # a call site above the claim leaves the claim (a bogus 11.9x)
    (float("nan"), float("nan"), 0.95, 0.95),   # else the lowest of the claim and the regimes'
    (float("nan"), float("nan"), 1.30, 1.2),    # a regime above the claim leaves the claim
    (float("nan"), float("nan"), float("nan"), 1.2),
])
def test_the_ratio_held_against_min_ratio_is_chosen_in_order(gpu, table, in_model, call_site, regime, want):
    table.frame["in_model_ratio"] = [in_model, float("nan")]
    table.frame["call_site_ratio"] = [call_site, float("nan")]
    table.frame["idle_gap_ratio"] = [regime, float("nan")]
    table.frame["idle_gap_regime"] = ["idle-gap:200us", ""]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = resolve(table, call(min_ratio=0.0))
    assert plan.ratio == pytest.approx(want)


@pytest.mark.parametrize(("method", "call_site", "runs"), [
    ("events", float("nan"), False),   # a sweep's single launches alone: not a figure to decide on
    ("events", 1.05, True),            # the call site measured it: that decides
    ("sustained", float("nan"), True),  # confirmed as a model calls it
    ("graph", float("nan"), True),
    ("", float("nan"), True),          # a table written before the method was kept: its claim
])
def test_a_claim_of_single_launches_alone_runs_no_kernel(gpu, table, method, call_site, runs):
    """Guards issue 46's rule: the dispatcher decides on in-model figures, then call-site ones,
    never on a sweep's single launches (they read up to 8% above what a caller gets)."""
    table.frame["method"] = [method, method]
    table.frame["call_site_ratio"] = [call_site, float("nan")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = resolve(table, call())
    assert (plan.kernel is not None) is runs
    if not runs:
        assert plan.fallback.reason is FallbackReason.BELOW_MIN_RATIO and math.isnan(plan.ratio)
        assert "only by single launches (its claim 1.200; `cutlass-tune confirm`" in str(caught[0].message)
        assert resolve(table, call(min_ratio=0.0)).kernel is not None  # min_ratio 0 runs every kernel


def test_a_regime_below_min_ratio_names_the_regime(gpu, table):
    table.frame["idle_gap_ratio"] = [0.96, float("nan")]
    table.frame["idle_gap_regime"] = ["idle-gap:200us", ""]
    with pytest.warns(RuntimeWarning, match=r"0\.960x torch in regime idle-gap:200us \(its claim 1\.200\)"):
        assert resolve(table, call()).kernel is None


def test_no_row_of_the_operation_falls_back_with_the_tables_reason(gpu, table):
    with pytest.warns(RuntimeWarning, match=r"no tuned problem for f16 -> f16 tn .*; using torch.matmul"):
        plan = resolve(table, call(dtype=DType.F16))
    assert plan.fallback.reason is FallbackReason.NO_ROW and "the table has: bf16 -> bf16 tn" in plan.fallback.detail


def test_another_gpus_table_falls_back_and_says_both_gpus_once(gpu, table):
    gpu[0] = H100
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plans = [resolve(table, call()), resolve(table, call(m=4096))]
    assert {p.fallback.reason for p in plans} == {FallbackReason.WRONG_GPU}
    [said] = [str(w.message) for w in caught]  # one warning per table and device, not per problem
    assert f"tuned on {H200}, not on this GPU (cuda:0, {H100})" in said


def test_no_routed_rows_plan_an_empty_result_without_a_warning(gpu, table):
    problem = Problem.experts(4, 64, 32, 0, dtype_a=DType.BF16, dtype_b=DType.BF16, dtype_d=DType.BF16,
                              layout_b=Layout.COL)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = resolve(table, Call(Kind.GROUPED, problem, 0, 1.0, ("grouped", 0)))
    assert plan.kernel is None and plan.fallback.reason is FallbackReason.EMPTY


def test_prepare_keeps_the_plan_and_a_refused_kernel_falls_back_once(gpu, table):
    c = call()
    ready = _dispatch.prepare(table, c)
    assert table.plans.get(c.signature) is ready and ready.plan.kernel is not None and ready.gemm is not None
    with pytest.warns(RuntimeWarning, match="cannot run 128x64x32"):
        refused = _dispatch.cannot_implement(table, c, ready, KernelStatusError("initialize", 7))
    assert table.plans.get(c.signature) is refused and refused.gemm is None
    assert refused.plan.fallback.reason is FallbackReason.CANNOT_IMPLEMENT


def test_the_plan_cache_is_one_lookup_and_safe_across_threads():
    cache = PlanCache()
    plan = Plan(Problem(128, 64, 32), 0)

    def put(i):
        for j in range(200):
            cache.put((i, j), Ready(plan))

    threads = [threading.Thread(target=put, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) == 800 and cache.get((3, 199)).plan is plan and cache.get((9, 9)) is None
    assert len(cache.entries()) == 800
    cache.clear()
    assert len(cache) == 0


def test_a_table_has_a_plan_cache_and_no_untyped_kernel_dict():
    t = BestTable(pd.DataFrame({"m": [], "n": [], "k": []}))
    assert isinstance(t.plans, PlanCache) and not hasattr(t, "_kernels")


def test_eager_direct_is_allowed_only_for_cuda_tensors_needing_no_gradient_untraced_and_unwatched():
    """Guards every door taking the same decision (a patched layer skipping the dispatch-mode check)."""
    x = torch.randn(4, 8).as_subclass(CudaLooking)
    w = torch.nn.Parameter(torch.randn(2, 8, 8)).as_subclass(CudaLooking)
    assert not eager_direct_allowed(torch.randn(4, 8))  # CPU tensors take the operator
    assert not eager_direct_allowed(x, w)  # w needs a gradient
    assert eager_direct_allowed(x, w.detach(), None)
    with torch.no_grad():
        assert eager_direct_allowed(x, w)
    with torch.inference_mode():
        assert eager_direct_allowed(x, w)

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Watch():
        assert not eager_direct_allowed(x, w)
    traced = torch.compile(lambda t: t + 1 if eager_direct_allowed(t) else t - 1, backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(traced(torch.zeros(3)), torch.full((3,), -1.0))


def test_a_patched_linear_under_a_dispatch_mode_goes_through_the_operator(tmp_path, monkeypatch):
    """Guards `cutlass-tune shapes` (a dispatch mode) seeing every call of a patched Linear: its
    eager-direct path skipped the mode check."""
    table = csv_table(tmp_path / "best.csv", [("bf16", "tn", 4, 16, 32)])
    layer = cutlass_tune.nn.Linear.from_linear(torch.nn.Linear(32, 16, dtype=torch.bfloat16), table)
    asked = []

    def decide(*tensors):
        asked.append(tensors)
        return eager_direct_allowed(*tensors)

    def direct(*args, **kwargs):
        raise AssertionError("the direct path ran under a dispatch mode")

    monkeypatch.setattr(_linear, "eager_direct_allowed", decide)
    monkeypatch.setattr(_linear, "mm_direct", direct)
    seen = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    x = torch.randn(4, 32, dtype=torch.bfloat16).as_subclass(CudaLooking)
    with torch.no_grad(), Watch():
        out = layer(x)
    assert asked and asked[0][0] is x
    assert "cutlass_tune.mm.default" in seen and out.shape == (4, 16)


def test_plans_and_calls_are_frozen_values():
    plan = Plan(Problem(128, 64, 32), 0)
    with pytest.raises(AttributeError):
        plan.device = 1  # type: ignore[misc]
    assert plan == Plan(Problem(128, 64, 32), 0) and plan.kernel is None and plan.args == b""


def test_the_workspace_policy_is_the_kernels(gpu):
    """Stream-K takes a workspace per launch (zeroed barriers; each captured launch its own),
    other kernels keep one; a grouped call asked for none kept takes one per call."""
    from cutlass_tune.runtime import Gemm, GroupedGemm
    from cutlass_tune.space import Grouping, KernelSchedule, TileScheduler

    bundled = BundledKernel("/bundle/k.so", "k0")
    stream_k = Gemm(KernelConfig(tile_scheduler=TileScheduler.STREAM_K), bundled=bundled)
    persistent = Gemm(KernelConfig(), bundled=bundled)
    grouped = GroupedGemm(KernelConfig(kernel_schedule=KernelSchedule.COOPERATIVE, layout_b=Layout.COL,
                                       grouping=Grouping.GROUPED), bundled=bundled)
    assert stream_k.workspace_policy(256) is Workspace.PER_CALL and stream_k.workspace_policy(0) is Workspace.NONE
    assert persistent.workspace_policy(256) is Workspace.KEPT
    assert grouped.workspace_policy(256, keep=True) is Workspace.KEPT
    assert grouped.workspace_policy(256, keep=False) is Workspace.PER_CALL


def test_tensors_no_kernel_takes_fall_back_once_with_the_reason(monkeypatch):
    monkeypatch.setattr(_dispatch, "_warned", set())
    err = cutlass_tune.runtime.MatmulInputError("a has dtype torch.float32")
    with pytest.warns(RuntimeWarning, match=r"^cutlass_tune.mm: a has dtype torch.float32; using torch's GEMM$"):
        fallback = _dispatch.input_not_taken("mm", err, "torch's GEMM")
    assert fallback.reason is FallbackReason.INPUT_NOT_TAKEN and fallback.detail == str(err)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per cause
        _dispatch.input_not_taken("mm", err, "torch's GEMM")


def test_a_grouped_call_far_from_its_nearest_tuned_rows_says_so_once_per_expert_shape(gpu, monkeypatch):
    """The kernel tuned at 49,152 routed rows runs a call of 6 (13 octaves away: a decode call on
    a prefill table) and says which sweep tunes that size, once per expert shape; 16,384 rows
    (1.6 octaves) says nothing. Nothing falls back: the kernel runs, and no RuntimeWarning."""
    from types import SimpleNamespace

    from cutlass_tune.runtime import FarRowWarning

    from .tables import grouped_rows

    table = BestTable(grouped_rows([("bf16", "tn", 64, 2816, 2048, 49152)]))
    table.frame["gpu"] = H200
    loaded = SimpleNamespace(config=SimpleNamespace(hash="h"), kernel=SimpleNamespace(library="lib", symbol="k"),
                             template=lambda problem, device: (b"args", 0),
                             workspace_policy=lambda size, keep: Workspace.NONE)
    monkeypatch.setattr(_dispatch, "load_kernel", lambda *a: loaded)  # the kernel's loading is not this test's

    def experts(rows):
        problem = Problem.experts(64, 2816, 2048, rows, dtype_a=DType.BF16, dtype_b=DType.BF16, dtype_d=DType.BF16,
                                  layout_b=Layout.COL)
        return Call(Kind.GROUPED, problem, 0, 0.0, ("grouped", rows))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plans = [resolve(table, experts(rows)) for rows in (16384, 6, 8)]
    assert all(p.kernel is not None and p.fallback is None for p in plans)
    [said] = caught
    assert said.category is FarRowWarning and not issubclass(said.category, RuntimeWarning)
    assert str(said.message) == (
        "cutlass_tune.grouped_mm: 6 routed rows of 64 experts of 2816x2048 run the kernel the table tuned at 49152 "
        "rows, its nearest (13 octaves away): a kernel tuned far from a call's size can be slower there; "
        "`cutlass-tune sweep --shapes e64:6x2816x2048` tunes this one")
