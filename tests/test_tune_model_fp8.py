"""The dense fp8 model of benchmarks/tune_model_fp8.py: what `shapes` records for it on the meta
device, and `tune-model`'s capture and `covered` meeting its row-wise problems in a table."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from cutlass_tune.capture import capture_gemms, load_target
from cutlass_tune.runtime import BestTable
from cutlass_tune.search._in_model import TORCH_HELD, InModelError, covered
from cutlass_tune.space import DType, Layout, Scaling

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "benchmarks" / "tune_model_fp8.py"
STORE = REPO / "benchmarks" / "results" / "fp8_h200_20261127" / "rowwise" / "fp8_suite-nvidia-h200.sqlite.gz"


@pytest.fixture(scope="module")
def widths():
    """The model file's module (its widths and token counts), as `load_target` imports it."""
    load_target(f"{MODEL}:build", {"tokens": 1, "layers": 1})
    return sys.modules["_cutlass_tune_model_tune_model_fp8"]


def expected(m, w):
    """(M, N, K) of the four Linears of a block at M tokens."""
    qkv = (w.HEADS + 2 * w.KV_HEADS) * w.HEAD_DIM
    return {(m, qkv, w.HIDDEN), (m, w.HIDDEN, w.HEADS * w.HEAD_DIM), (m, 2 * w.INTERMEDIATE, w.HIDDEN),
            (m, w.HIDDEN, w.INTERMEDIATE)}


def problems_at(tokens):
    return list(capture_gemms(load_target(f"{MODEL}:build", {"tokens": tokens, "layers": 2})).problems())


def fake_table(problems):
    """A table of one row per problem: the committed row-wise store's first kernel, renamed."""
    row = BestTable.load(STORE).frame.iloc[0]
    rows = []
    for p in problems:
        r = row.copy()
        r["m"], r["n"], r["k"], r["problem"] = p.m, p.n, p.k, p.name
        rows.append(r)
    return pd.DataFrame(rows)


def test_shapes_records_the_row_wise_fp8_gemms_of_every_token_count(tmp_path, widths):
    out = tmp_path / "fp8.yaml"
    r = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "shapes", f"{MODEL}:both", "-o", out],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    spec = yaml.safe_load(out.read_text())
    assert spec["dtypes"] == [{"input": "e4m3", "output": "bf16"}] and spec["layouts"] == ["tn"]
    assert {p["scaling"] for p in spec["problems"]} == {"rowcol"}
    found = {(p["m"], p["n"], p["k"]) for p in spec["problems"]}
    assert found == set().union(*(expected(m, widths) for m in widths.TOKENS))


def test_the_capture_at_a_token_count_is_row_wise_e4m3_to_bf16_tn(widths):
    problems = problems_at(128)
    assert {(p.m, p.n, p.k) for p in problems} == expected(128, widths)
    for p in problems:
        assert (p.dtype_a, p.dtype_b, p.dtype_d) == (DType.E4M3, DType.E4M3, DType.BF16)
        assert (p.layout_a, p.layout_b, p.scaling) == (Layout.ROW, Layout.COL, Scaling.ROWCOL)
        assert p.epilogue.is_plain


def test_covered_meets_every_problem_of_a_table_made_of_them():
    problems = problems_at(128)
    found = covered(BestTable(fake_table(problems)), problems)
    assert {c.problem for c in found} == {p.name for p in problems}
    assert all(c.names == {c.problem} and c.candidates[0].is_torch and len(c.candidates) == 2 for c in found)


def test_the_baseline_is_the_same_model_on_torchs_own_path(widths):
    """`build_torch` (tune-model's --baseline): the same weights and input as `build`, every Linear
    quantizing its input and calling torch._scaled_mm itself (no table, no graph break)."""
    model, (x,) = widths.build(tokens=16, layers=1)
    base, (y,) = widths.build_torch(tokens=16, layers=1)
    for name in ("qkv", "o", "gate_up", "down"):
        ours, theirs = getattr(model.blocks[0], name), getattr(base.blocks[0], name)
        assert isinstance(theirs, widths.TorchFp8Linear) and not isinstance(theirs, widths.Fp8Linear)
        assert theirs.weight.shape == ours.weight.shape and theirs.weight.dtype == ours.weight.dtype
        assert theirs.weight_scale.shape == ours.weight_scale.shape
    assert x.shape == y.shape and base(y).shape == (1, 16, widths.HIDDEN)


def test_torchs_step_runs_scaled_mm_with_the_fast_accumulation_the_kernels_were_measured_against(monkeypatch):
    """Regression: torch's step ran on a table without rows, where the dispatcher runs
    torch._scaled_mm without fast accumulation (5-10% slower at M 2048): the in-model ratios of
    fast-accumulation kernels read 1.08-1.11 where the sweep read 0.98-1.00. The step keeps their
    rows below any min_ratio, so the dispatcher falls back with fast accumulation."""
    from cutlass_tune.runtime._dispatch import Call, FallbackReason, Kind, resolve
    from cutlass_tune.search._in_model import schedule, step_frame

    problems = problems_at(128)
    frame = fake_table(problems)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: frame["gpu"].iloc[0])
    assert frame["fp8_fast_accum"].astype(str).str.lower().eq("true").all()
    found = covered(BestTable(frame), problems)
    torch_step = step_frame(frame, schedule(found)[0])
    assert len(torch_step) == len(problems) and (torch_step["in_model_ratio"] == TORCH_HELD).all()
    for p in problems:
        plan = resolve(BestTable(torch_step), Call(Kind.DENSE, p, 0, 1.0, ()))
        assert plan.kernel is None and plan.fallback.reason is FallbackReason.BELOW_MIN_RATIO
        assert plan.fallback.fast_accum and "with fast accumulation" in plan.fallback.path
        # without a row (the step before), torch's path without fast accumulation
        bare = resolve(BestTable(frame.iloc[:0]), Call(Kind.DENSE, p, 0, 1.0, ()))
        assert bare.fallback.reason is FallbackReason.NO_ROW and not bare.fallback.fast_accum


def test_the_committed_row_wise_store_covers_none_of_the_models_problems():
    """Why the model's shapes are swept first: the store holds one M per shape, none the model's."""
    with pytest.raises(InModelError, match="the table has none of the model's 4 GEMM problems"):
        covered(BestTable.load(STORE), problems_at(128))


def test_tune_model_writes_in_model_ratios_of_the_fp8_model_with_the_gpu_faked(tmp_path, monkeypatch):
    """The command on the fp8 model at two token counts, kernel times recorded: every covered
    row-wise problem gets torch's in-model time over its kernel's."""
    from typer.testing import CliRunner

    import cutlass_tune.bench as bench
    from cutlass_tune.bench import _in_model as gpu
    from cutlass_tune.cli import app
    from cutlass_tune.search._in_model import RANGE_PREFIX, STEP_PREFIX

    from .search.test_in_model import tree

    problems = problems_at(128) + problems_at(2048)
    table = tmp_path / "fp8.csv"
    fake_table(problems).to_csv(table, index=False)
    monkeypatch.setattr(bench, "require_gpu", lambda gpu: None)
    monkeypatch.setattr(torch.cuda, "set_device", lambda gpu: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda gpu=None: "NVIDIA H200")
    monkeypatch.setattr(gpu, "precompile", lambda rows: None)
    monkeypatch.setattr(gpu, "build_step", lambda target, mode, patched=True: (lambda: None))
    monkeypatch.setattr(gpu, "ab", lambda steps, blocks: [gpu.Side(label, (10.0, 10.5)) for label in steps])
    torch_us = {p.name: 10.0 + p.m * p.n * p.k / 1e9 for p in problems}

    def profiled(step, tables, rounds, watch=None):
        """Per problem of the step's table: torch's time, the table's kernel 0.8 of it."""
        events = []
        for r in range(rounds):
            for i, t in enumerate(tables):
                # torch's step: the fast-accumulation rows held below min_ratio (TORCH_HELD)
                torch_step = (t.frame["in_model_ratio"] == TORCH_HELD).all()
                doors = [tree(RANGE_PREFIX + name, kernels=[us if torch_step else 0.8 * us])
                         for name, us in torch_us.items()
                         if torch_step or name in set(t.frame["problem"])]
                events += [tree(f"{STEP_PREFIX}{r * len(tables) + i}", *doors), *doors]
        return events

    monkeypatch.setattr(gpu, "profiled_steps", profiled)
    out = tmp_path / "tuned.csv"
    r = CliRunner().invoke(app, ["tune-model", f"{MODEL}:build", "--table", str(table), "--tokens", "128",
                                 "--tokens", "2048", "--mode", "compiled", "--out", str(out), "--rounds", "3"],
                           terminal_width=250)
    assert r.exit_code == 0, r.output
    tuned = BestTable.load(out).frame.set_index("problem")
    assert set(tuned.index) == set(torch_us)
    assert tuned["in_model_ratio"].tolist() == pytest.approx([1 / 0.8] * len(torch_us))


@pytest.mark.gpu
def test_the_compiled_fp8_model_times_every_linear_call_in_its_problems_range():
    """Guards tune-model's attribution on the compiled fp8 model: each Fp8Linear call, its GEMM
    the scaled operator inside the graph, opens its problem's profiler range with GPU work under
    it (torch's path here)."""
    from cutlass_tune.bench._in_model import Mode, bind, build_step, profiled_steps
    from cutlass_tune.search._in_model import kernel_times

    empty = BestTable(pd.DataFrame())
    bind(empty)
    step = build_step(load_target(f"{MODEL}:build", {"tokens": 128, "layers": 1}), Mode.COMPILED)
    names = {p.name: p.name for p in problems_at(128)}
    times = kernel_times(profiled_steps(step, [empty, empty], 2), names)
    assert sorted(times) == [0, 1, 2, 3]
    assert all(set(step_times) == set(names) and min(step_times.values()) > 0 for step_times in times.values())
