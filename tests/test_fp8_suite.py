"""The fp8 suites of benchmarks/ without a GPU: their space files (benchmarks/configs/fp8_suite.yaml,
fp8_blockwise_suite.yaml, fp8_blockwise_narrow_n.yaml) as a sweep loads them, and
benchmarks/fp8_call_site.py's torch paths, table and goals (its timing runs on the GPU, benchmarks/gpu_fp8_suite.sh)."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

from cutlass_tune.bench._verify import allocate, randomize, reference
from cutlass_tune.search._seeds import fp8_defaults
from cutlass_tune.space import (
    DType,
    EpilogueSchedule,
    KernelConfig,
    KernelSchedule,
    Layout,
    Problem,
    Scaling,
    check_config,
    check_problem,
    load_space,
)

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def call_site():
    spec = importlib.util.spec_from_file_location("fp8_call_site", BENCHMARKS / "fp8_call_site.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fp8_call_site"] = module  # dataclasses resolve the module's names through it
    spec.loader.exec_module(module)
    yield module
    del sys.modules["fp8_call_site"]


@pytest.mark.parametrize(("name", "scaling", "count"), [("fp8_suite", Scaling.ROWCOL, 10),
                                                         ("fp8_blockwise_suite", Scaling.BLOCKWISE, 11)])
def test_each_suite_holds_llm_shapes_from_decode_to_prefill_each_with_valid_configs(name, scaling, count):
    """Slow: counts the valid configs of the suite's fp8 kind (its walk, seconds; the process keeps it)."""
    space = load_space(BENCHMARKS / "configs" / f"{name}.yaml")
    assert len(space.problems) == count >= 8
    assert [p.m for p in space.problems] == sorted(p.m for p in space.problems)
    assert (space.problems[0].m, space.problems[-1].m) == (16, 16384)
    for p in space.problems:
        assert (p.dtype_a, p.dtype_b, p.dtype_d, p.scaling) == (DType.E4M3, DType.E4M3, DType.BF16, scaling)
        assert (p.layout_a, p.layout_b) == (Layout.ROW, Layout.COL)
        assert check_problem(p) == [], p.name
        assert len(space.auto_for(p)) > 0, p.name


def test_the_narrow_n_space_holds_the_suites_small_m_shapes_with_tiles_as_narrow_as_their_scales():
    narrow = load_space(BENCHMARKS / "configs" / "fp8_blockwise_narrow_n.yaml")
    suite = load_space(BENCHMARKS / "configs" / "fp8_blockwise_suite.yaml")
    assert list(narrow.problems) == [p for p in suite.problems if p.m <= 256]
    assert narrow.census().valid == len(narrow.valid) == 6
    assert {(c.tile_m, c.tile_n, c.scale_n) for c in narrow.valid} == {(64, 64, 64), (64, 32, 32), (128, 64, 64)}
    assert all(c.stages == 0 for c in narrow.valid)  # the block-wise builder counts its own stages


def test_the_blockwise_suite_searches_both_schedules_and_small_clusters_of_128_wide_tiles():
    """The tiles CUTLASS 4.2's block-wise mainloop builds (tile N 128; 256 fails its static_assert,
    ping-pong 128-row tiles spill the second accumulator) on both schedules and small clusters."""
    space = load_space(BENCHMARKS / "configs" / "fp8_blockwise_suite.yaml")
    assert all(p.n % 128 == 0 and p.k % 128 == 0 for p in space.problems)
    problem = space.problems[0]
    schedules = {KernelSchedule.COOPERATIVE: (128, EpilogueSchedule.TMA_COOPERATIVE),
                 KernelSchedule.PINGPONG: (64, EpilogueSchedule.TMA)}
    for schedule, (tile_m, epilogue) in schedules.items():
        for tile_n in (128,):
            for cluster in ((1, 1), (2, 1), (1, 2)):
                cfg = KernelConfig.for_operation(problem, tile_m=tile_m, tile_n=tile_n, tile_k=128,
                                                 cluster_m=cluster[0], cluster_n=cluster[1], kernel_schedule=schedule,
                                                 epilogue_schedule=epilogue, epilogue_source=False)
                assert space.holds(cfg), cfg.name
    for tile_m, tile_n, schedule in ((128, 64, KernelSchedule.COOPERATIVE), (128, 256, KernelSchedule.COOPERATIVE),
                                     (128, 128, KernelSchedule.PINGPONG)):
        cfg = KernelConfig.for_operation(problem, tile_m=tile_m, tile_n=tile_n, tile_k=128, kernel_schedule=schedule,
                                         epilogue_schedule=schedules[schedule][1], epilogue_source=False)
        assert [r.rule for r in check_config(cfg)] == ["blockwise_registers" if tile_n == 128 else "blockwise_tile"]
        assert not space.holds(cfg)
    # the yaml's comment: of the hand-picked fp8 seeds, only the promoting cooperative 128x128 2x1
    (seed,) = fp8_defaults(problem, space)
    assert (seed.tile_m, seed.tile_n, seed.cluster_m, seed.kernel_schedule, seed.fp8_fast_accum) == \
        (128, 128, 2, KernelSchedule.COOPERATIVE, False)


def _ops(scaling):
    problem = Problem(64, 256, 512, dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16, scaling=scaling)
    ops = allocate(problem, "cpu")
    randomize(ops, torch.Generator().manual_seed(0))
    return ops


@pytest.mark.parametrize(("scaling", "path"), [(Scaling.ROWCOL, "torch._scaled_mm rowwise"),
                                               (Scaling.BLOCKWISE, "blockwise_dequantized_mm")])
def test_torchs_path_computes_the_scaled_product(call_site, scaling, path):
    name, call = call_site.torch_path(scaling, torch.device("cpu"), 512)  # the CPU has no block-wise _scaled_mm
    ops = _ops(scaling)
    ref = reference(ops)
    assert name == path
    assert torch.linalg.vector_norm(call(ops).float() - ref) / torch.linalg.vector_norm(ref) < 0.01


def _record(scaling, m, ratio, baseline):
    return {"problem": f"{m}x4096x4096_{scaling}", "scaling": scaling, "m": m, "n": 4096, "k": 4096,
            "kernel": "k", "claimed": 1.1, "baseline": baseline, "rel_error": 1e-3,
            "graph": {"ratio": ratio}, "loop": {"ratio": ratio}}


def test_the_table_has_a_section_per_scaling_with_its_goals(call_site):
    rowwise = [_record("rowcol", m, r, "torch._scaled_mm rowwise") for m, r in ((16, 1.10), (4096, 0.96))]
    blockwise = [_record("blockwise", m, r, "blockwise_dequantized_mm")
                 for m, r in ((16, 1.5), (256, 1.0), (512, 1.02), (16384, 0.99))]
    failed = {**_record("blockwise", 64, None, "blockwise_dequantized_mm"), "graph": {}, "loop": {},
              "rel_error": None, "error": "RuntimeError: boom"}
    text = "\n".join(call_site.table_lines(rowwise + blockwise + [failed]))
    rowcol_part, blockwise_part = text.split("\nblockwise, against blockwise_dequantized_mm\n")
    assert "rowcol, against torch._scaled_mm rowwise" in rowcol_part and "| 64x" not in rowcol_part
    # geomean 1.03 meets 1.00, but 0.96 is below the floor of 0.97
    assert f"graph, every M: geomean {math.sqrt(1.10 * 0.96):.3f} over 2 shapes, lowest 0.960" in rowcol_part
    assert rowcol_part.rstrip().endswith("missed")
    assert "| 64x4096x4096 | - | - | 1.100 | RuntimeError: boom | k |" in blockwise_part
    small, large = [line for line in blockwise_part.splitlines() if line.startswith("graph")]
    assert small == (f"graph, M <= 256: geomean {math.sqrt(1.5):.3f} over 2 shapes, lowest 1.000; "
                     "goal (geomean >= 1.20): met")
    assert large.startswith(f"graph, M > 256: geomean {math.sqrt(1.02 * 0.99):.3f} over 2 shapes") and \
        large.endswith("goal (geomean >= 1.00): met")


def test_a_scaling_without_graph_ratios_prints_no_verdict(call_site):
    only_failed = {**_record("blockwise", 32, None, "torch._scaled_mm blockwise"), "graph": {}, "loop": {},
                   "rel_error": None, "error": "ValueError: x"}
    lines = call_site.table_lines([only_failed])
    assert lines[0] == "\nblockwise, against torch._scaled_mm blockwise"
    assert not any(line.startswith("graph") for line in lines)


def test_the_swap_space_holds_the_narrow_spaces_shapes_with_weight_tiles_as_tall_as_their_scales():
    swap = load_space(BENCHMARKS / "configs" / "fp8_blockwise_swap.yaml")
    narrow = load_space(BENCHMARKS / "configs" / "fp8_blockwise_narrow_n.yaml")
    assert list(swap.problems) == list(narrow.problems)
    assert swap.census().valid == len(swap.valid) == 14
    assert all(c.swap_ab and c.tile_m == c.scale_n and c.stages == 0 for c in swap.valid)
    assert {(c.tile_m, c.tile_n) for c in swap.valid} == {(m, n) for m in (64, 128) for n in (16, 32, 64, 128)}
