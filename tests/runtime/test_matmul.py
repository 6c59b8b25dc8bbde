import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch

import cutlass_tune
from cutlass_tune.bench._check import problem_of_row
from cutlass_tune.runtime import BestTable, MatmulInputError, _dispatch, _matmul, problem_of
from cutlass_tune.runtime._table import Match
from cutlass_tune.space import DType, Epilogue, EpilogueSchedule, KernelConfig, KernelSchedule, Layout, Problem, Scaling

STORE = Path(__file__).resolve().parents[2] / "results" / "sweep-nvidia-h200.sqlite"
TEMPLATE = Path(__file__).resolve().parents[1] / "report" / "data" / "best-v2.csv"


def test_cpu_tensors_are_refused_with_a_reason():
    a = torch.randn(64, 64, dtype=torch.bfloat16)
    with pytest.raises(MatmulInputError, match="is on cpu: the tuned kernels run on a CUDA device"):
        cutlass_tune.matmul(a, a, table=STORE)


@pytest.mark.gpu
def test_layouts_dtypes_and_alignment_are_checked():
    a = torch.randn(256, 128, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(512, 128, dtype=torch.bfloat16, device="cuda")
    p = problem_of(a, w.t())
    assert (p.m, p.n, p.k, p.layout_a, p.layout_b) == (256, 512, 128, Layout.ROW, Layout.COL)
    assert problem_of(a.t().contiguous().t(), w.t().contiguous()).layout_a is Layout.COL
    with pytest.raises(MatmulInputError, match="dtype torch.float32"):
        problem_of(a.float(), w.t().float())
    with pytest.raises(MatmulInputError, match="must match"):
        problem_of(a, w.t().half())
    with pytest.raises(MatmulInputError, match="do not multiply"):
        problem_of(a, w)
    with pytest.raises(MatmulInputError, match="16-byte aligned"):
        problem_of(a.view(-1)[1:1 + 255 * 128].view(255, 128), w[:, :].t()[:128, :255])
    with pytest.raises(MatmulInputError, match="not a multiple of 8"):
        problem_of(torch.randn(64, 100, dtype=torch.bfloat16, device="cuda"),
                   torch.randn(64, 100, dtype=torch.bfloat16, device="cuda").t())
    with pytest.raises(MatmulInputError, match="neither row- nor column-major"):
        problem_of(a[:, ::2], w.t()[::2])


def _matches_torch(table, row):
    """matmul of a row's problem (bf16, a @ w.t()) against an fp32 reference, the table's kernel
    whatever its ratio (min_ratio 0); returns what the table keeps for those tensors."""
    a = torch.randn(row.m, row.k, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(row.n, row.k, dtype=torch.bfloat16, device="cuda")
    got = cutlass_tune.matmul(a, w.t(), table=table, min_ratio=0.0)
    ref = a.float() @ w.float().t()
    assert torch.isfinite(got).all()
    assert ((got.float() - ref).norm() / ref.norm()).item() < 1e-2, row.problem
    [kept] = [table.plans.get(k) for k in table.plans if k[1:3] == (a.shape, w.t().shape) and k[9] == 0.0]
    return kept


@pytest.mark.gpu
@pytest.mark.nvcc
def test_tuned_matmul_matches_torch_for_every_tuned_problem():
    table = BestTable.load(STORE)
    for row in table.frame.itertuples():
        _matches_torch(table, row)


@pytest.mark.gpu
@pytest.mark.nvcc
def test_a_bundle_runs_its_kernels_where_nothing_can_compile(tmp_path, monkeypatch):
    out = tmp_path / "bundle"
    done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "export", "--storage", STORE, "-o", out],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

    def no_compiler(*args, **kwargs):
        raise AssertionError("a bundle's kernels must not be compiled")

    monkeypatch.setattr(cutlass_tune.compile, "compile_kernels", no_compiler)
    monkeypatch.setenv("CUTLASS_TUNE_NVCC", str(tmp_path / "no-nvcc"))
    table = BestTable.load(out)
    for row in table.frame.itertuples():
        _, gemm, _ = _matches_torch(table, row)
        assert gemm.kernel.library.parent == out / "kernels" and gemm.config.hash == row.config_hash
        print(f"bundle {row.problem}: {gemm.kernel.library.name} {gemm.kernel.symbol} ok")


@pytest.mark.gpu
def test_untuned_dtype_falls_back_to_torch_once():
    table = BestTable.load(STORE)
    a = torch.randn(256, 256, dtype=torch.float16, device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = cutlass_tune.matmul(a, a.t(), table=table)
        cutlass_tune.matmul(a, a.t(), table=table)
    assert torch.equal(first, torch.matmul(a, a.t()))
    assert [str(w.message) for w in caught].count(
        "cutlass_tune.matmul: no tuned problem for f16 -> f16 tn (the table has: bf16 -> bf16 tn); "
        "using torch.matmul") == 1


@pytest.mark.gpu
@pytest.mark.nvcc
def test_an_f32_result_asked_of_a_bf16_table_comes_from_torch_in_f32():
    # Guards against matmul handing back a kernel's bf16 output when float32 was asked for.
    table = BestTable.load(STORE)
    a = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = cutlass_tune.matmul(a, w.t(), table=table, out_dtype=torch.float32)
        tuned = cutlass_tune.matmul(a, w.t(), table=table, min_ratio=0.0)  # the store's rows: a sweep's only
    assert got.dtype == torch.float32 and tuned.dtype == torch.bfloat16
    ref = a.float() @ w.float().t()
    assert ((got - ref).norm() / ref.norm()).item() < 1e-5
    assert ((tuned.float() - ref).norm() / ref.norm()).item() < 1e-2
    assert any("no tuned problem for bf16 -> f32 tn" in str(w.message) for w in caught)
    with pytest.raises(MatmulInputError, match="out_dtype torch.float8_e4m3fn is not supported"):
        cutlass_tune.matmul(a, w.t(), table=table, out_dtype=torch.float8_e4m3fn)


@pytest.mark.gpu
@pytest.mark.nvcc
def test_repeated_calls_stay_correct_on_new_and_reused_buffers():
    # Regression guard for the fast path: initialize is skipped only when nothing changed.
    table = BestTable.load(STORE)
    for row in table.frame.itertuples():
        a = torch.randn(row.m, row.k, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(row.n, row.k, dtype=torch.bfloat16, device="cuda")
        ref = a.float() @ w.float().t()
        for _ in range(3):  # min_ratio 0: the kernel runs though the store holds a sweep's figures only
            got = cutlass_tune.matmul(a, w.t(), table=table, min_ratio=0.0)
            assert ((got.float() - ref).norm() / ref.norm()).item() < 1e-2, row.problem
        a2 = torch.randn_like(a)
        got = cutlass_tune.matmul(a2, w.t(), table=table, min_ratio=0.0)
        ref2 = a2.float() @ w.float().t()
        assert ((got.float() - ref2).norm() / ref2.norm()).item() < 1e-2, row.problem


def test_untuned_fp8_falls_back_to_scaled_mm_with_a_bf16_result():
    a = torch.randn(32, 64).to(torch.float8_e4m3fn)
    w = torch.randn(48, 64).to(torch.float8_e4m3fn)
    got = _matmul.torch_gemm(a, w.t(), torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == (32, 48)
    torch.testing.assert_close(got.float(), a.float() @ w.float().t(), rtol=1e-2, atol=1e-2)


def _fp8_table(config_json):
    row = dict(gpu="any", problem="4096x4096x4096_e4m3e4m3bf16_tn", m=4096, n=4096, k=4096, dtype_a="e4m3",
               dtype_b="e4m3", dtype_d="bf16", layout="tn", kernel="fp8", config=config_json,
               raster="along_n", swizzle=4, splits=1, decomposition="heuristic", ratio=1.0)
    return BestTable(pd.DataFrame([row]))


@pytest.mark.gpu
@pytest.mark.nvcc
def test_fp8_inputs_run_the_tuned_fp8_kernel():
    cfg = KernelConfig(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_m=128, tile_n=256, tile_k=128,
                       cluster_m=2, fp8_fast_accum=True)
    table = _fp8_table(json.dumps(cfg.to_dict()))
    a = torch.randn(4096, 4096, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(2048, 4096, device="cuda").to(torch.float8_e4m3fn)  # a nearby, untuned N
    p = problem_of(a, w.t())
    assert (p.dtype_a, p.dtype_d, p.layout_a, p.layout_b) == (DType.E4M3, DType.BF16, Layout.ROW, Layout.COL)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = cutlass_tune.matmul(a, w.t(), table=table)
        again = cutlass_tune.matmul(a, w.t(), table=table)  # the cached fast path
    assert not [x for x in caught if "cutlass_tune" in str(x.message)]  # no fallback to torch
    ref = a.float() @ w.float().t()
    assert got.dtype == torch.bfloat16 and torch.equal(got, again)
    assert ((got.float() - ref).norm() / ref.norm()).item() < 2e-2


@pytest.mark.gpu
def test_fp8_inputs_are_checked_and_fall_back_to_scaled_mm():
    a = torch.randn(256, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(512, 128, device="cuda").to(torch.float8_e4m3fn)
    with pytest.raises(MatmulInputError, match="fp8 inputs need layout tn"):
        problem_of(a, w.t().contiguous())
    with pytest.raises(MatmulInputError, match="float8_e5m2"):
        problem_of(a.to(torch.float8_e5m2), w.t().to(torch.float8_e5m2))
    table = BestTable.load(STORE)  # bf16 only
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = cutlass_tune.matmul(a, w.t(), table=table)
    assert any("using torch._scaled_mm" in str(x.message) for x in caught)
    one = torch.ones((), device="cuda")
    assert torch.equal(got, torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize(("ratio", "min_ratio", "kernel_runs"), [(1.02, 1.0, True), (0.94, 1.0, False),
                                                                 (0.94, 0.9, True), (0.94, 0.0, True)])
def test_torch_is_kept_where_the_table_measured_its_kernel_slower(ratio, min_ratio, kernel_runs):
    """An fp8 row-wise entry measured below `min_ratio` runs torch._scaled_mm with fast
    accumulation (what its fast-accumulation kernel was measured against), bit for bit, with
    one warning naming the ratio; at or above it, the kernel."""
    cfg = KernelConfig(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_m=128, tile_n=128, tile_k=128, cluster_m=2,
                       kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA,
                       fp8_fast_accum=True, scaling=Scaling.ROWCOL)  # the row-wise leader at 1024x4096x4096
    row = _fp8_table(json.dumps(cfg.to_dict())).frame.iloc[0].to_dict()
    row.update(problem="4096x4096x4096_e4m3e4m3bf16_tn_scale-rowcol", scaling="rowcol", ratio=ratio,
               fp8_fast_accum=True)
    table = BestTable(pd.DataFrame([row]))
    a = torch.randn(4096, 4096, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(4096, 4096, device="cuda").to(torch.float8_e4m3fn)
    scale_a = torch.rand(4096, 1, device="cuda") + 0.5
    scale_b = torch.rand(1, 4096, device="cuda") + 0.5
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [cutlass_tune.matmul(a, w.t(), table, scale_a=scale_a, scale_b=scale_b, min_ratio=min_ratio)
               for _ in range(2)]
    said = [str(x.message) for x in caught if "min_ratio" in str(x.message)]
    fast = torch._scaled_mm(a, w.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16, use_fast_accum=True)
    assert torch.equal(got[0], got[1])
    if kernel_runs:
        assert not said
        ref = (a.float() @ w.float().t()) * scale_a * scale_b
        assert ((got[0].float() - ref).norm() / ref.norm()).item() < 2e-2
    else:
        assert len(said) == 1 and f"measured at {ratio:.3f}x torch" in said[0] and "fast accumulation" in said[0]
        assert torch.equal(got[0], fast)


@pytest.mark.parametrize(("cells", "ratio"), [({"ratio": "0.94"}, 0.94), ({"ratio": 1.2}, 1.2),
                                              ({"ratio": ""}, math.nan)])
def test_a_match_reads_its_row_s_ratio(tmp_path, cells, ratio):
    """What matmul's min_ratio reads of the row it found, as a table file gives it (a string, a
    number, an empty cell): NaN where the row has no ratio."""
    row = pd.read_csv(TEMPLATE, dtype=str).iloc[0].to_dict()
    row = {k: v for k, v in row.items() if k != "ratio"} | cells
    pd.DataFrame([row]).to_csv(tmp_path / "t.csv", index=False)
    match = BestTable.load(tmp_path / "t.csv").find(int(row["m"]), int(row["n"]), int(row["k"]),
                                                    problem_of_row(row).operation)
    assert match.ratio == ratio or math.isnan(ratio) and math.isnan(match.ratio)


def test_torchs_fp8_path_makes_no_tensor_beside_the_gemm(monkeypatch):
    """With both scales given, torch's fp8 path is the one torch._scaled_mm call (a unit scale
    made per call was a fill kernel launched before each); without, the unit scale is made once."""
    a = torch.randn(32, 64).to(torch.float8_e4m3fn)
    w = torch.randn(48, 64).to(torch.float8_e4m3fn)
    sa, sb = torch.rand(32, 1) + 0.5, torch.rand(1, 48) + 0.5
    _matmul.torch_gemm(a, w.t(), torch.bfloat16)  # the unit scale of this device, made here
    made = []
    real_ones = torch.ones
    monkeypatch.setattr(torch, "ones", lambda *args, **kw: made.append(args) or real_ones(*args, **kw))
    scaled = _matmul.torch_gemm(a, w.t(), torch.bfloat16, scale_a=sa, scale_b=sb)
    unit = _matmul.torch_gemm(a, w.t(), torch.bfloat16)
    assert made == []
    torch.testing.assert_close(scaled.float(), (a.float() @ w.float().t()) * sa * sb, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(unit.float(), a.float() @ w.float().t(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_a_unit_scale_first_made_under_graph_capture_is_not_kept():
    """torch's fp8 path first reached inside a CUDA graph's capture makes its unit scale there
    (filled only when the graph replays, in the graph's memory) and does not keep it: a later
    eager call is right."""
    _matmul._UNIT_SCALES.clear()
    a = torch.randn(256, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(512, 128, device="cuda").to(torch.float8_e4m3fn)
    # cuBLAS makes its handle on first use, which a capture forbids: warm it up outside the capture,
    # with scales of the test's own, so that no unit scale is made (as a caller's warm-up would).
    own = torch.ones((), device="cuda")
    torch._scaled_mm(a, w.t(), own, own, out_dtype=torch.bfloat16)
    torch.cuda.synchronize()
    assert not _matmul._UNIT_SCALES
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _matmul.torch_gemm(a, w.t(), torch.bfloat16)
    assert not _matmul._UNIT_SCALES
    graph.replay()
    eager = _matmul.torch_gemm(a, w.t(), torch.bfloat16)
    want = (a.float() @ w.float().t()).to(torch.bfloat16)
    torch.testing.assert_close(captured, want, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(eager, want, rtol=2e-2, atol=2e-2)
    assert list(_matmul._UNIT_SCALES) == [a.device]


@pytest.mark.parametrize(("epilogue", "cells", "expected"), [
    ("bias+gelu_tanh", {"ratio": 1.10, "cublaslt_ratio": 0.95}, 0.95),  # torch_gemm runs cuBLASLt's epilogue
    ("bias+relu", {"ratio": 1.10, "cublaslt_ratio": math.nan}, 1.10),  # no cuBLASLt figure: the baseline's
    ("bias+gelu", {"ratio": 1.10, "cublaslt_ratio": 0.95}, 1.10),  # erf GELU: no cuBLASLt path computes it
    ("silu+gated", {"ratio": 1.10}, 1.10),
])
def test_min_ratio_reads_the_ratio_to_the_path_torch_would_run(epilogue, cells, expected):
    """Where matmul keeps torch, it runs `torch_gemm`: for a bias with ReLU or tanh GELU, cuBLASLt's
    epilogue, so the kernel must beat that to run; otherwise the row's own baseline."""
    problem = Problem(4096, 4096, 4096, epilogue=Epilogue.parse(epilogue))
    match = Match(pd.Series(cells), exact=True, distance=0.0)
    assert _dispatch.ratio_to_torch(match, problem) == pytest.approx(expected)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["relu", "gelu_tanh"])
def test_torchs_path_for_a_bias_with_relu_or_tanh_gelu_is_cublaslt_s_epilogue(activation):
    x = torch.randn(512, 1024, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(2048, 1024, dtype=torch.bfloat16, device="cuda")
    bias = torch.randn(2048, dtype=torch.bfloat16, device="cuda")
    got = _matmul.torch_gemm(x, w.t(), torch.bfloat16, bias=bias, activation=activation)
    lt = torch._addmm_activation(bias, x, w.t(), use_gelu=activation == "gelu_tanh")
    assert torch.equal(got, lt)
    act = torch.relu if activation == "relu" else (lambda y: torch.nn.functional.gelu(y, approximate="tanh"))
    ref = act(x.float() @ w.float().t() + bias.float())
    assert ((got.float() - ref).norm() / ref.norm()).item() < 1e-2
