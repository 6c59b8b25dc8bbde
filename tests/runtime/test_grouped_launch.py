"""`GroupedGemm.launch`'s caches on the CPU, the kernel library replaced at its ctypes boundary
(`LoadedKernel`) by a recorder: which calls initialize and which only run, with which
addresses and workspace, kept or per call. The kernels themselves run in test_grouped_gpu.py."""

import itertools
import json
import math
import sys
import types
import warnings

import pandas as pd
import pytest
import torch

from cutlass_tune.kernel import KernelStatusError
from cutlass_tune.runtime import BestTable, _dispatch, _grouped, _grouped_op, _matmul, register_table
from cutlass_tune.space import (
    DType,
    Grouping,
    KernelConfig,
    KernelSchedule,
    Layout,
    Problem,
    RuntimeArgs,
    TileScheduler,
)
from cutlass_tune.tables import BundledKernel

E, N, K, M = 4, 16, 32, 24
WORKSPACE = 4096


class FakeInstance:
    def __init__(self, log):
        self.log, self.closed = log, False

    def initialize(self, args, workspace, stream):
        self.log.append(("initialize", id(self), dict(a=args.a, b=args.b, c=args.c, d=args.d, offsets=args.offsets,
                                                      m=args.m, n=args.n, k=args.k, groups=args.groups),
                         workspace, stream))
        if self.log.fail:
            raise KernelStatusError("initialize", 4)

    def run(self, stream):
        self.log.append(("run", id(self), stream))

    def close(self):
        self.closed = True


class Log(list):
    fail = False

    def of(self, kind):
        return [entry for entry in self if entry[0] == kind]


class FakeKernel:
    """Stands for `LoadedKernel`: the entry points a grouped launch calls."""

    log = Log()
    workspace_bytes = WORKSPACE

    def __init__(self, library, symbol):
        self.library, self.symbol, self.creates = library, symbol, 0

    def workspace_size(self, args):
        return self.workspace_bytes * args.groups // E

    def create(self):
        self.creates += 1
        return FakeInstance(self.log)


@pytest.fixture
def gemm(monkeypatch):
    FakeKernel.log = Log()
    monkeypatch.setattr(_matmul, "LoadedKernel", FakeKernel)
    streams = itertools.repeat(7)
    monkeypatch.setattr(_grouped, "current_stream", lambda device: next(streams))
    monkeypatch.setattr(_grouped, "bind_primary_context", lambda device: None)
    monkeypatch.setattr(_grouped, "sm_count", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    cfg = KernelConfig(tile_m=128, tile_n=128, tile_k=64, kernel_schedule=KernelSchedule.COOPERATIVE,
                       tile_scheduler=TileScheduler.PERSISTENT, layout_b=Layout.COL, grouping=Grouping.GROUPED)
    g = _grouped.GroupedGemm(cfg, bundled=BundledKernel("unused.so", "k0"))
    g.set_streams = lambda *values: monkeypatch.setattr(_grouped, "current_stream",
                                                        lambda device, it=iter(values): next(it))
    return g


def operands(m=M, experts=E):
    a = torch.randn(m, K, dtype=torch.bfloat16)
    b = torch.randn(experts, N, K, dtype=torch.bfloat16).transpose(-2, -1)
    offs = torch.full((experts,), m, dtype=torch.int32)
    return a, b, offs


def plan(gemm, m=M, experts=E):
    problem = Problem.experts(experts, N, K, m, dtype_a=DType.BF16, dtype_b=DType.BF16, dtype_d=DType.BF16,
                              layout_b=Layout.COL)
    return gemm.prepare(problem, 0)


def test_same_addresses_launch_without_initializing_again(gemm):
    p, (a, b, offs) = plan(gemm), operands()
    out = torch.empty(M, N, dtype=torch.bfloat16)
    for _ in range(3):
        assert gemm.launch(p, a, b, offs, out, keep_workspace=True) is out
    [(_, instance, args, workspace, stream)] = FakeKernel.log.of("initialize")
    assert args == dict(a=a.data_ptr(), b=b.data_ptr(), c=out.data_ptr(), d=out.data_ptr(), offsets=offs.data_ptr(),
                        m=M, n=N, k=K, groups=E)
    assert workspace and stream == 7
    assert [entry[1] for entry in FakeKernel.log.of("run")] == [instance] * 3


@pytest.mark.parametrize("changed", ["a", "b", "out", "offs"])
def test_a_new_address_initializes(gemm, changed):
    """Guards the ready instances' key: every address the kernel's parameters hold is in it."""
    p, (a, b, offs) = plan(gemm), operands()
    out = torch.empty(M, N, dtype=torch.bfloat16)
    gemm.launch(p, a, b, offs, out, keep_workspace=True)
    new = dict(a=a, b=b, offs=offs, out=out)
    new[changed] = new[changed].clone()
    gemm.launch(p, new["a"], new["b"], new["offs"], new["out"], keep_workspace=True)
    first, second = FakeKernel.log.of("initialize")
    key = "d" if changed == "out" else "offsets" if changed == "offs" else changed
    assert second[2][key] == new[changed].data_ptr() != first[2][key]


def test_kept_workspace_is_one_per_stream(gemm):
    p, (a, b, offs) = plan(gemm), operands()
    out = torch.empty(M, N, dtype=torch.bfloat16)
    gemm.set_streams(7, 7, 9, 7)
    for _ in range(4):
        gemm.launch(p, a, b, offs, out, keep_workspace=True)
    inits = FakeKernel.log.of("initialize")
    assert [(i[4]) for i in inits] == [7, 9]  # the fourth call finds stream 7's instance
    assert inits[0][3] != inits[1][3]
    assert [r[2] for r in FakeKernel.log.of("run")] == [7, 7, 9, 7]


def test_kept_workspace_grows_for_more_experts(gemm):
    small, large = plan(gemm), plan(gemm, experts=2 * E)
    out = torch.empty(M, N, dtype=torch.bfloat16)
    gemm.launch(small, *operands(), out, keep_workspace=True)
    gemm.launch(large, *operands(experts=2 * E), out, keep_workspace=True)
    [workspace] = gemm._local.workspaces.values()
    assert workspace.numel() == 2 * WORKSPACE
    assert FakeKernel.log.of("initialize")[1][3] == workspace.data_ptr()


def test_no_workspace_is_kept_when_not_asked_or_in_a_capture(gemm, monkeypatch):
    """Guards CUDA graph capture: nothing allocated in a captured call outlives it."""
    p, (a, b, offs) = plan(gemm), operands()
    gemm.launch(p, a, b, offs, keep_workspace=False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    gemm.launch(p, a, b, offs, keep_workspace=True)
    assert not getattr(gemm._local, "workspaces", None)
    assert all(i[3] for i in FakeKernel.log.of("initialize"))


def test_least_recently_used_instance_is_reinitialized(gemm, monkeypatch):
    monkeypatch.setattr(_grouped, "READY_GROUPED", 2)
    p, (a, b, offs) = plan(gemm), operands()
    outs = [torch.empty(M, N, dtype=torch.bfloat16) for _ in range(3)]
    for out in (outs[0], outs[1], outs[0], outs[2], outs[0]):
        gemm.launch(p, a, b, offs, out, keep_workspace=True)
    assert gemm.kernel.creates == 2
    inits = FakeKernel.log.of("initialize")
    assert [i[2]["d"] for i in inits] == [outs[0].data_ptr(), outs[1].data_ptr(), outs[2].data_ptr()]
    assert inits[2][1] == inits[1][1]  # outs[1]'s instance, the least recently used, took outs[2]


def test_refused_initialization_is_not_kept(gemm):
    p, (a, b, offs) = plan(gemm), operands()
    FakeKernel.log.fail = True
    for _ in range(2):
        with pytest.raises(KernelStatusError):
            gemm.launch(p, a, b, offs, keep_workspace=True)
    assert len(FakeKernel.log.of("initialize")) == 2 and not FakeKernel.log.of("run")
    assert not gemm._local.ready


def test_prepare_fixes_the_shape_and_workspace(gemm):
    p = plan(gemm, m=100)
    assert p.out_shape == (100, N) and p.out_dtype == torch.bfloat16 and p.workspace_bytes == WORKSPACE
    assert (p.args.groups, p.args.sm_count, p.args.a) == (E, 132, None)
    assert p != plan(gemm, m=100)  # compared by identity: a key of the hot path


def test_another_workspace_initializes(gemm):
    """Guards the workspace address in the ready instances' key (the parameters point into it)."""
    p, (a, b, offs) = plan(gemm), operands()
    out = torch.empty(M, N, dtype=torch.bfloat16)
    gemm.launch(p, a, b, offs, out, keep_workspace=True)
    gemm.launch(p, a, b, offs, out, keep_workspace=False)  # the kept one is still held: another address
    first, second = FakeKernel.log.of("initialize")
    assert first[3] == gemm._local.workspaces[(0, 7)].data_ptr() != second[3]


def test_no_workspace_is_kept_on_the_stream_of_cuda_graph_trees(gemm, monkeypatch):
    """Guards torch.compile's CUDA graph trees: their warm-up allocates in their graphs' pool,
    which refuses memory held past a run."""
    manager = types.SimpleNamespace(stream=types.SimpleNamespace(cuda_stream=7))
    trees = types.SimpleNamespace(local=types.SimpleNamespace(tree_manager_containers={
        0: types.SimpleNamespace(tree_manager=manager)}), get_obj=getattr)
    monkeypatch.setitem(sys.modules, "torch._inductor.cudagraph_trees", trees)
    p, (a, b, offs) = plan(gemm), operands()
    gemm.launch(p, a, b, offs, keep_workspace=True)
    assert not gemm._local.workspaces and FakeKernel.log.of("initialize")[0][3]
    manager.stream.cuda_stream = 9  # another stream than the trees': kept
    gemm.launch(p, a, b, offs, keep_workspace=True)
    assert list(gemm._local.workspaces) == [(0, 7)]


def test_may_keep_without_cuda_graph_trees(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch._inductor.cudagraph_trees", raising=False)
    assert _grouped._may_keep(0, 7)
    broken = types.SimpleNamespace(local=types.SimpleNamespace(tree_manager_containers=None), get_obj=getattr)
    monkeypatch.setitem(sys.modules, "torch._inductor.cudagraph_trees", broken)
    assert not _grouped._may_keep(0, 7)  # internals not as expected: a workspace per call


class Rows:
    """Stands for a device's rows of a table: one grouped row of `ratio` for every lookup."""

    def __init__(self, config, ratio):
        self.row = pd.Series({"config": json.dumps(config.to_dict()), "config_hash": "h", "ratio": ratio,
                              "kernel": config.name})
        self.exact = False
        self.distance = 1.0  # the nearest tuned rows, an octave away
        self.runtime = RuntimeArgs()
        self.ratio = ratio

    def find(self, *args, **kwargs):
        return self

    def dispatch_ratio(self, claim=None):
        """No in-model, call-site or regime figures: the claim (`Match.dispatch_ratio`)."""
        return (self.ratio if claim is None else claim), ""


@pytest.fixture
def table(gemm, monkeypatch):
    """A registered table whose every grouped lookup answers with `gemm`'s config, at `table.ratio`;
    CPU tensors pass for CUDA ones of device 0."""
    t = BestTable(pd.DataFrame({"m": [], "n": [], "k": []}), bundled={"h": BundledKernel("unused.so", "k0")})
    t.ratio = 1.2
    monkeypatch.setattr(_dispatch, "_device_rows", lambda table, device: (Rows(gemm.config, table.ratio), None))
    monkeypatch.setattr(_grouped, "grouped_problem_of", lambda a, b, offs, out_dtype=None, *scales: Problem.experts(
        b.shape[0], b.shape[2], b.shape[1], a.shape[0], dtype_a=DType.BF16, dtype_b=DType.BF16, dtype_d=DType.BF16,
        layout_b=Layout.COL))
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(_grouped, "torch_grouped_mm", lambda a, b, offs, dtype=None: "torch")
    monkeypatch.setattr(_dispatch, "_warned", set())
    _dispatch.clear_loaded()
    yield t
    _dispatch.clear_loaded()


@pytest.mark.parametrize("capturing", [False, True])
def test_operator_keeps_a_workspace_outside_capture_only(table, monkeypatch, capturing):
    """Guards the operator's host time: outside capture no workspace is allocated per call."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing)
    key = register_table(table, key="grouped-launch")
    a, b, offs = operands()
    for _ in range(2):
        _grouped_op._grouped_mm_cuda(a, b, offs, key)
    assert len(FakeKernel.log.of("run")) == 2
    [resolved] = table.plans.entries()
    workspaces = getattr(resolved.gemm._local, "workspaces", {})
    assert (not workspaces) if capturing else list(workspaces) == [(0, 7)]


@pytest.mark.parametrize(("ratio", "min_ratio", "runs"), [(1.2, 1.0, True), (0.9, 1.0, False), (0.9, 0.8, True),
                                                          (math.nan, 1.0, False), (math.nan, 0.0, True)])
def test_torch_is_kept_where_the_table_measured_it_faster(table, ratio, min_ratio, runs):
    table.ratio = ratio
    a, b, offs = operands()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [_grouped.grouped_mm(a, b, offs, table=table, min_ratio=min_ratio) for _ in range(2)]
    assert (results[0] == "torch") is not runs and len(FakeKernel.log.of("run")) == (2 if runs else 0)
    said = [str(w.message) for w in caught if "min_ratio" in str(w.message)]
    assert len(said) == (0 if runs else 1)  # once, not per call
    if not runs:
        assert "no ratio" in said[0] if math.isnan(ratio) else "0.900x" in said[0]


def test_no_routed_rows_give_an_empty_result_directly_and_through_the_operator(table):
    """Guards an expert-parallel rank given no tokens: M = 0 was refused where torch returns (0, N)."""
    a, b, offs = operands(m=0)
    direct = _grouped.grouped_mm(a, b, offs, table=table)
    key = register_table(table, key="grouped-empty")
    through_operator = _grouped_op._grouped_mm_cuda(a, b, offs, key)
    for out in (direct, through_operator):
        assert out.shape == (0, N) and out.dtype == torch.bfloat16
    assert not FakeKernel.log.of("run") and not FakeKernel.log.of("initialize")
