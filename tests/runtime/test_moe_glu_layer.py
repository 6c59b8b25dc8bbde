"""The MoE layer's GLU stage (cutlass_tune/runtime/_moe_glu.py) on the CPU: which path runs when,
the interleaved weights laid out once per weight version, the same output as the unfused path,
torch.compile with no graph break, and the GLU problem the layer asks for being the one a
sweep of `--epilogue silu+glu` tunes.

Off CUDA no table has a row of this GPU: the tests stand in for the table's answer
(`_moe_glu._table_row`), and the stage's operator computes with torch on the interleaved
weights; tests/runtime/test_moe_glu_gpu.py runs the GLU kernel."""

import logging
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch

from cutlass_tune.errors import ConfigFileError
from cutlass_tune.runtime import BestTable, _dispatch, register_table
from cutlass_tune.runtime import _moe_glu as glu
from cutlass_tune.runtime._moe import SWIGLU_OAI, ExpertActivation, GateForm, MoEExperts, experts_layout, moe_experts
from cutlass_tune.space import Activation, Epilogue, EpilogueSchedule, Layout, Problem, check_config, sweep_space
from cutlass_tune.tables import experts_cells

from .test_moe import layer, routed

EMPTY = register_table(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})), key="moe-glu-empty")
ALTERNATING = ExpertActivation(Activation.SILU, GateForm.GLU, interleaved=True)


@pytest.fixture
def glu_row(monkeypatch):
    """The table has a GLU row of this GPU for every layer (a stand-in for a tuned table on a GPU)."""
    monkeypatch.setattr(glu, "_table_row", lambda key, device, problem: "")
    glu._reasons.clear()
    _forget_warnings()
    yield
    glu._reasons.clear()
    _forget_warnings()


def _forget_warnings():
    """The stage says each cause once a process: each test hears its own."""
    _dispatch._warned.difference_update({k for k in _dispatch._warned if k.startswith("moe glu")})


@pytest.fixture
def taken(monkeypatch):
    """Records "glu" for each call of the GLU stage, "unfused" for each activation pass."""
    seen = []
    stage, activation = glu.gate_up_glu, ExpertActivation.__call__
    monkeypatch.setattr(glu, "gate_up_glu", lambda *a: seen.append("glu") or stage(*a))
    monkeypatch.setattr(ExpertActivation, "__call__", lambda self, h: seen.append("unfused") or activation(self, h))
    return seen


def bf16_layer(**kw):
    gate_up, down, b1, b2 = layer(dtype=torch.bfloat16, **kw)
    return gate_up, down, b1, b2


def call(gate_up, down, *, tokens=7, glu_on=True, **kw):
    index, weights = routed(tokens=tokens, top_k=2, used=[0, 2, 3, 5])  # experts 1 and 4 get no rows
    x = torch.randn(tokens, 32, generator=torch.Generator().manual_seed(tokens)).to(gate_up.dtype)
    return moe_experts(x, index, weights, gate_up, down, table=EMPTY, glu=glu_on, **kw)


@pytest.mark.parametrize(("spec", "activation"), [
    (dict(), "silu"),
    (dict(transposed=True), "gelu"),
    (dict(), ALTERNATING),
    (dict(transposed=True), ExpertActivation(Activation.GELU_TANH, GateForm.GLU, interleaved=True)),
])
def test_the_glu_path_gives_the_unfused_paths_output(glu_row, taken, spec, activation):
    gate_up, down, _, _ = bf16_layer(**spec)
    with torch.no_grad():
        got = call(gate_up, down, activation=activation, **spec)
        assert taken == ["glu"]
        want = call(gate_up, down, activation=activation, glu_on=False, **spec)
    assert taken == ["glu", "unfused"]
    # the same bf16 GEMM columns in another order, then the same activation: the same bits
    assert torch.equal(got, want)


def test_expert_parallel_sentinels_contribute_zero_on_the_glu_path(glu_row, taken):
    gate_up, down, _, _ = bf16_layer()
    index = torch.tensor([[0, 7], [3, 1], [9, 3], [2, 8]])  # 7, 8, 9: other ranks' experts of a 6-expert rank
    weights = torch.rand(4, 2)
    x = torch.randn(4, 32).bfloat16()
    with torch.no_grad():
        got = moe_experts(x, index, weights, gate_up, down, table=EMPTY, expert_parallel=True, glu=True)
        want = moe_experts(x, index, weights, gate_up, down, table=EMPTY, expert_parallel=True, glu=False)
    assert taken == ["glu", "unfused"] and torch.equal(got, want)


@pytest.mark.parametrize(("spec", "activation", "why"), [
    (dict(gated=False), "silu", None),  # nothing to fuse, and nothing said
    (dict(), SWIGLU_OAI, "GPT-OSS's clamped SwiGLU"),
    (dict(), ExpertActivation(Activation.SILU, GateForm.GLU, limit=7.0), "clamped at 7.0"),
    (dict(bias=True), "silu", "gate_up has a bias"),
    (dict(dtype=torch.float32), "silu", "the GLU kernels take bfloat16 or float16"),
])
def test_a_layer_the_glu_node_cannot_express_runs_unfused_and_says_why_once(glu_row, taken, monkeypatch, caplog,
                                                                             spec, activation, why):
    monkeypatch.setattr(glu, "_runs_kernels", lambda device: True)  # said for layers on a GPU only
    spec = {"dtype": torch.bfloat16, **spec}
    gate_up, down, b1, b2 = layer(**spec)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad(), \
            caplog.at_level(logging.INFO, logger=glu.__name__):
        warnings.simplefilter("always")
        for _ in range(2):
            call(gate_up, down, activation=activation, gate_up_bias=b1, down_bias=b2,
                 transposed=spec.get("transposed", False))
    assert taken == ["unfused", "unfused"]
    assert not [w for w in caught if "cutlass_tune" in str(w.message)]  # no fallback to torch: no warning
    said = [r.getMessage() for r in caplog.records if "run apart" in r.getMessage()]
    if why is None:
        assert said == []
    else:
        assert len(said) == 1 and why in said[0]
    module = MoEExperts(gate_up, down, table=EMPTY, activation=activation, gate_up_bias=b1, down_bias=b2,
                        glu=True)
    assert module.glu_path.startswith("unfused: ") and (why is None or why in module.glu_path)


def test_a_pair_of_partial_blocks_poses_no_glu_problem():
    gate_up, down = torch.empty(6, 24, 32, device="meta"), torch.empty(6, 32, 12, device="meta")
    why = glu.glu_problem(experts_layout(gate_up, down, "silu", False), torch.bfloat16, 14)
    assert why == "2I = 24 is not a multiple of 16 (gate and up in blocks of 8)"


def _asked_on_an_h200(key, problem):
    """The table's answer for the GLU problem (`_table_row`) as on a CUDA device of an H200."""
    monkey = glu._device_rows
    try:
        glu._device_rows = lambda t, device: (t.for_gpu("NVIDIA H200"), None)
        return glu._table_row(key, 0, problem)
    finally:
        glu._device_rows = monkey


def test_without_a_glu_row_the_layer_runs_unfused_and_names_the_sweep(taken, monkeypatch):
    """Off CUDA the real lookup answers; on a GPU a table without the row names the command."""
    gate_up, down, _, _ = bf16_layer()
    with torch.no_grad():
        call(gate_up, down)
    assert taken == ["unfused"]
    problem = glu.glu_problem(experts_layout(gate_up, down, "silu", False), torch.bfloat16, 14)
    plain = Problem.experts(6, 32, 32, 14, layout_b=Layout.COL)  # the plain gate_up is tuned, its GLU form not
    table = BestTable(pd.DataFrame([dict(gpu="NVIDIA H200", problem=plain.name, m=14, n=32, k=32, ratio=1.2,
                                         **plain.operation.cells(), **experts_cells(plain))]))
    key = register_table(table, key="moe-glu-norow")
    why = _asked_on_an_h200(key, problem)
    assert "no row of bf16bf16bf16_tn_grouped_silu+glu for 6 experts of 32x32" in why
    assert "cutlass-tune sweep --shapes e6:ROWSx32x32 --epilogue silu+glu" in why
    # a table of no rows, as a test's or torch's-only one, on a GPU
    monkeypatch.setattr(glu, "_device_rows", lambda t, device: (t, None))
    assert glu._table_row(EMPTY, 0, problem) == "the table has no rows"


@pytest.mark.parametrize("glu_ratio,plain_ratio,loses", [
    (1.20, 1.10, False),   # the GLU kernel's gain over torch's GEMM and activation is the larger
    (1.05, 1.10, True),    # the plain kernel and the pass are faster
    (1.02, 0.95, False),   # the plain row is below torch's GEMM: apart, torch's GEMM runs
    (0.98, None, True),    # no plain row: apart is torch's GEMM and activation
])
def test_a_glu_row_slower_than_the_gemm_and_activation_apart_keeps_them_apart(glu_ratio, plain_ratio, loses):
    rows = _glu_and_plain_rows(glu_ratio, plain_ratio)
    key = register_table(BestTable(pd.DataFrame(rows)), key=f"moe-glu-apart-{glu_ratio}-{plain_ratio}")
    why = _asked_on_an_h200(key, _glu_problem())
    if not loses:
        assert why == ""
    else:
        assert why.startswith(f"the table's GLU kernel for 6 experts of 32x32 was measured at {glu_ratio:.3f}x "
                              "torch's GEMM and activation, below ")
        assert ("plain gate_up kernel's 1.100x" in why) if plain_ratio else why.endswith("torch's path (1.0)")


def _glu_problem():
    gate_up, down, _, _ = bf16_layer()
    return glu.glu_problem(experts_layout(gate_up, down, "silu", False), torch.bfloat16, 14)


def _glu_and_plain_rows(glu_ratio, plain_ratio, glu_ms=None, plain_ms=None, plain_m=96):
    """A GLU row at 96 routed rows and, unless `plain_ratio` is None, the plain gate_up row at
    `plain_m`, with their kernels' median times where given."""
    problem = _glu_problem()
    tuned = Problem.experts(6, 32, 32, 96, layout_b=Layout.COL, epilogue=problem.epilogue)
    rows = [dict(gpu="NVIDIA H200", problem=tuned.name, m=96, n=32, k=32, ratio=glu_ratio,
                 **tuned.operation.cells(), **experts_cells(tuned))]
    if plain_ratio is not None:
        plain = Problem.experts(6, 32, 32, plain_m, layout_b=Layout.COL)
        rows.append(dict(gpu="NVIDIA H200", problem=plain.name, m=plain_m, n=32, k=32, ratio=plain_ratio,
                         **plain.operation.cells(), **experts_cells(plain)))
    for row, ms in zip(rows, (glu_ms, plain_ms)):
        if ms is not None:
            row["median_ms"] = ms
    return rows


@pytest.mark.parametrize("glu_ms,plain_ms,plain_m,loses", [
    # DeepSeek-V2-Lite's gate_up on an H200: the GLU row 1.546x torch's GEMM and eager activation,
    # the plain row (49152 rows, the nearest) 1.043x; per routed row 21.1 ns against 17.9
    (0.5186, 0.880, 192, True),
    (0.4000, 0.880, 192, False),  # the GLU kernel faster per routed row than the plain one
    (0.5186, None, 96, False),    # the plain row has no kernel time: the ratios decide
])
def test_a_glu_kernel_slower_than_the_plain_gemm_keeps_them_apart_whatever_its_ratio(glu_ms, plain_ms, plain_m,
                                                                                     loses):
    rows = _glu_and_plain_rows(1.546, 1.043, glu_ms, plain_ms, plain_m)
    key = register_table(BestTable(pd.DataFrame(rows)), key=f"moe-glu-times-{glu_ms}-{plain_ms}")
    why = _asked_on_an_h200(key, _glu_problem())
    if not loses:
        assert why == ""
    else:
        glu_ns, plain_ns = glu_ms * 1e6 / 96, plain_ms * 1e6 / plain_m
        assert why == (f"the table's GLU kernel for 6 experts of 32x32 takes {glu_ns:.1f} ns a routed row, more than "
                       f"the plain gate_up kernel's {plain_ns:.1f} (its rows' kernel times; apart, the activation "
                       "pass is one more)")


def test_the_glu_path_is_logged_once_per_layer(glu_row, monkeypatch, caplog):
    monkeypatch.setattr(glu, "_runs_kernels", lambda device: True)
    gate_up, down, _, _ = bf16_layer()
    with torch.no_grad(), caplog.at_level(logging.INFO, logger=glu.__name__):
        for _ in range(3):
            call(gate_up, down)
    said = [r.getMessage() for r in caplog.records]
    assert said == ["cutlass_tune.moe_experts: 6 experts of 32x32 (bfloat16, glu silu): gate_up runs the GLU kernel "
                    "(bf16bf16bf16_tn_grouped_silu+glu)"]


def test_gradients_needed_or_glu_off_run_unfused(glu_row, taken):
    gate_up, down, _, _ = bf16_layer()
    gate_up.requires_grad_()
    out = call(gate_up, down)  # grad mode on, a weight needs it: the GLU kernel keeps no gate and up
    out.float().sum().backward()
    assert taken == ["unfused"] and gate_up.grad is not None
    with torch.no_grad():
        call(gate_up, down, glu_on=False)
        call(gate_up, down)
    assert taken == ["unfused", "unfused", "glu"]
    module = MoEExperts(gate_up, down, table=EMPTY, glu=False)
    assert module.glu_path == "unfused: glu off" and "glu='unfused: glu off'" in repr(module)
    assert MoEExperts(gate_up, down, table=EMPTY, glu=True).glu_path == "glu"
    assert MoEExperts(gate_up, down, table=EMPTY).glu_path == "glu"  # on unless turned off


def test_batched_decode_is_not_the_glu_path(glu_row, taken):
    gate_up, down, _, _ = bf16_layer()
    with torch.no_grad():
        call(gate_up, down, decode="batched")
    assert taken == ["unfused"]


def test_the_weights_are_laid_out_once_per_version(glu_row, monkeypatch):
    laid = []
    lay_out = glu._lay_out
    monkeypatch.setattr(glu, "_lay_out", lambda *a: laid.append(a[1:]) or lay_out(*a))
    gate_up, down, _, _ = bf16_layer()
    module = MoEExperts(gate_up, down, table=EMPTY, glu=True)
    index, weights = routed(tokens=5, top_k=2)
    x = torch.randn(5, 32).bfloat16()
    with torch.no_grad():
        first = module(x, index, weights)
        assert torch.equal(module(x, index, weights), first)
        assert len(laid) == 1
        module.gate_up.mul_(2)  # an in-place update (a load_state_dict): laid out again, once
        second = module(x, index, weights)
        module(x, index, weights)
        want = moe_experts(x, index, weights, module.gate_up, down, table=EMPTY, glu=False)
    assert len(laid) == 2 and torch.equal(second, want) and not torch.equal(second, first)


def test_torch_compile_traces_the_glu_stage_with_no_graph_break(glu_row):
    torch._dynamo.reset()
    gate_up, down, _, _ = bf16_layer()
    module = MoEExperts(gate_up, down, table=EMPTY, glu=True)
    index, weights = routed(tokens=6, top_k=2)
    x = torch.randn(6, 32).bfloat16()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm

    compiled = torch.compile(module, backend=backend, fullgraph=True)
    with torch.no_grad():
        got = compiled(x, index, weights)
        want = moe_experts(x, index, weights, gate_up, down, table=EMPTY, glu=False)
    assert torch.equal(got, want)
    assert len(graphs) == 1 and "moe_gate_up_glu" in graphs[0]


def test_the_operators_fake_gives_the_halved_shape():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        rows = torch.empty(40, 32, dtype=torch.bfloat16)
        out = glu.gate_up_glu_op(rows, torch.empty(6, 32, 32, dtype=torch.bfloat16), torch.empty(6, dtype=torch.int32),
                                 EMPTY, "silu", False, False)
        transposed = glu.gate_up_glu_op(rows, torch.empty(6, 32, 48, dtype=torch.bfloat16),
                                        torch.empty(6, dtype=torch.int32), EMPTY, "silu", True, False)
    assert tuple(out.shape) == (40, 16) and tuple(transposed.shape) == (40, 24)


def test_the_layers_glu_problem_is_the_one_a_glu_sweep_tunes():
    """The layer looks the table up by the problem `cutlass-tune sweep --shapes eE:MxNxK --epilogue
    silu+glu` measures: Qwen3-235B's gate_up (128 experts, 2I = 3072, H = 4096)."""
    gate_up = torch.empty(128, 3072, 4096, dtype=torch.bfloat16, device="meta")
    down = torch.empty(128, 4096, 1536, dtype=torch.bfloat16, device="meta")
    problem = glu.glu_problem(experts_layout(gate_up, down, "silu", False), torch.bfloat16, 32768)
    assert problem.name == "32768x3072x4096_bf16bf16bf16_tn_grouped_silu+glu_e128-uniform"
    assert problem.epilogue == Epilogue.parse("silu+glu") and problem.epilogue.output_shape(32768, 3072) == (32768,
                                                                                                             1536)
    [swept] = sweep_space(None, "e128:32768x3072x4096", epilogue="silu+glu", routing="zipf").problems
    assert swept.operation == problem.operation and (swept.groups, swept.n, swept.k) == (128, 3072, 4096)
    assert swept.name == problem.name.replace("-uniform", "-zipf")


def test_torchs_path_of_a_glu_problem_is_act_gate_times_up_of_the_split_weights():
    """What `grouped_mm`'s plan runs where the table's GLU kernel cannot: the GEMM on the
    interleaved weights, then the pair (D of N/2)."""
    from cutlass_tune.runtime._grouped import _torch_path

    torch.manual_seed(0)
    split = torch.randn(3, 32, 16).bfloat16()  # E x 2I x H, gate rows then up rows
    rows = torch.randn(9, 16).bfloat16()
    offs = torch.tensor([4, 4, 9], dtype=torch.int32)
    problem = Problem.experts(3, 32, 16, 9, layout_b=Layout.COL, epilogue=Epilogue.parse("gelu+glu"))
    got = _torch_path(problem, rows, glu.interleave_gate_up(split).transpose(-2, -1), offs, None, None)
    h = torch.cat([rows[:4] @ split[0].T, rows[4:9] @ split[2].T])
    want = torch.nn.functional.gelu(h[:, :16]) * h[:, 16:]
    assert got.shape == (9, 16)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(("shapes", "epilogue", "why"), [
    ("e8:64x24x32", "silu+glu", "glu_shape: a GLU pair needs N a multiple of 16"),
    ("e8:64x32x32", "silu+glu-split", "lay the weights out once with runtime.interleave_gate_up"),
    ("64x32x32", "silu+glu", "its glu node is declared but no kernel renders it yet"),
])
def test_a_glu_sweep_of_a_problem_no_glu_kernel_runs_is_a_one_line_error(shapes, epilogue, why):
    with pytest.raises(ConfigFileError, match=why):
        sweep_space(None, shapes, epilogue=epilogue)


def test_the_glu_benchmark_space_is_eleven_glu_kernels_of_the_layers_problems():
    space = sweep_space(Path(__file__).resolve().parents[2] / "benchmarks" / "configs" / "moe_glu_bf16.yaml")
    assert [p.name for p in space.problems] == ["32768x3072x4096_bf16bf16bf16_tn_grouped_silu+glu_e128-uniform",
                                                 "24576x2816x2048_bf16bf16bf16_tn_grouped_silu+glu_e64-uniform"]
    assert len(space.valid) == 11
    for cfg in space.valid:
        assert cfg.epilogue == space.problems[0].epilogue and cfg.epilogue_schedule is EpilogueSchedule.NO_SMEM
        assert check_config(cfg) == [] and not cfg.epilogue_source


def test_the_glu_stage_launches_through_the_native_door(monkeypatch):
    """Where the native library is loaded, the stage's kernel launches from C++ (`grouped_glu`,
    resolved in Python once per signature) on the laid-out weights, by the table's door key;
    its resolver checks a call as the Python path does."""
    from cutlass_tune.runtime import _native
    from cutlass_tune.runtime._matmul import MatmulInputError
    from cutlass_tune.runtime._op import registered_table

    calls = []

    class Door:
        def grouped_glu(self, *args):
            calls.append(args)
            return "native"

    monkeypatch.setattr(_native, "door", Door())
    gate_up, _, _, _ = bf16_layer()
    rows, offs = torch.randn(14, 32).bfloat16(), torch.tensor([2, 4, 6, 8, 10, 14], dtype=torch.int32)
    assert glu._gate_up_glu_cuda(rows, gate_up, offs, EMPTY, "silu", False, False) == "native"
    (a, b, o, key, activation), = calls
    assert a is rows and o is offs and activation == "silu"
    assert torch.equal(b, glu.interleave_gate_up(gate_up).transpose(-2, -1))
    assert key == _native.door_key(registered_table(EMPTY))
    with pytest.raises(MatmulInputError, match="a is on cpu: the tuned kernels run on a CUDA device"):
        glu._resolve_glu_door(a, b, o, key, activation)


def test_the_stage_is_called_without_its_python_operator_where_the_native_library_is_loaded(monkeypatch):
    """Regression (H200): with the native library loaded, eager code went through the stage's
    Python custom op (`eager_direct_allowed` keeps native operators' cheaper C++ dispatch), 58 us
    a stage call against 20 us for its C++ launch."""
    from types import SimpleNamespace

    monkeypatch.setattr(_dispatch, "native_operators", True)
    cuda = SimpleNamespace(is_cuda=True, requires_grad=False)
    assert not _dispatch.eager_direct_allowed(cuda, cuda)  # a native operator: its dispatch
    assert _dispatch.eager_direct_allowed(cuda, cuda, native_op=False)  # a Python one: the direct call
    direct = []
    monkeypatch.setattr(glu, "eager_direct_allowed", lambda *t, native_op=True: direct.append(native_op) or True)
    monkeypatch.setattr(glu, "_gate_up_glu_cuda", lambda *args: "direct")
    gate_up, down, _, _ = bf16_layer()
    layout = experts_layout(gate_up, down, "silu", False)
    assert glu.gate_up_glu(torch.ones(2, 32), gate_up, torch.ones(6, dtype=torch.int32), EMPTY, layout) == "direct"
    assert direct == [False]
