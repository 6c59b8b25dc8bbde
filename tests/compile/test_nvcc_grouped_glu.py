"""Grouped GLU kernels: the gate_up GEMM of a MoE layer with act(gate) * up in its epilogue
(templates/gemm_sm90_glu_epilogue.cu.j2), D of N/2 columns.

The render and the rules run on a CPU; the `nvcc` test builds a cooperative and a ping-pong
kernel in one unit with real nvcc for sm_90a (no GPU: the queries and `can_implement` are host
code). tests/compile/test_gpu_grouped_glu.py runs them against torch on a GPU.
"""

import ctypes
import dataclasses

import pytest

from cutlass_tune.compile import KernelCache, compile_kernels, find_toolchain
from cutlass_tune.errors import RenderError
from cutlass_tune.kernel import ABI_VERSION, LoadedKernel, make_args
from cutlass_tune.render import render_unit
from cutlass_tune.space import (
    GLU_BLOCK,
    Activation,
    Epilogue,
    EpilogueSchedule,
    Grouping,
    KernelConfig,
    KernelSchedule,
    Pair,
    Problem,
    RuntimeArgs,
    check_config,
    check_problem,
    smem_usage,
)
from cutlass_tune.status import Status

SILU_GLU = Epilogue(activation=Activation.SILU, pair=Pair.INTERLEAVED)
GLU = dict(grouping=Grouping.GROUPED, epilogue_schedule=EpilogueSchedule.NO_SMEM, epilogue_source=False)
GROUPED_GLU = [
    # The tile of the Qwen3-235B gate_up table's kernel (128x192 cooperative, cluster 1x2).
    KernelConfig(**GLU, epilogue=SILU_GLU, tile_n=192, cluster_n=2),
    KernelConfig(**GLU, epilogue=Epilogue(activation=Activation.GELU_TANH, pair=Pair.INTERLEAVED), tile_m=64,
                 tile_n=128, kernel_schedule=KernelSchedule.PINGPONG),
]
SM_COUNT = 132


def test_the_glu_kernels_are_valid_and_render_the_collective_once_per_unit():
    for cfg in GROUPED_GLU:
        assert check_config(cfg) == [], cfg.name
    source = render_unit(GROUPED_GLU).source
    assert source.count("#define CUTLASS_TUNE_GLU_EPILOGUE_DEFINED") == 1
    assert source.count("cutlass_tune_glu::GluEpilogueArray<cutlass::detail::TagToStrideC_t<LayoutD*>, Fusion>") == 2
    assert "GluOp<ElementD, cutlass::epilogue::thread::SiLu>" in source
    assert "GluOp<ElementD, cutlass::epilogue::thread::GELU_taylor>" in source
    assert source.count("constexpr int64_t kPairs = 2;") == 2
    assert source.count(f"constexpr int64_t kNMultiple = {2 * GLU_BLOCK};") == 2
    assert "p.arrays.d[e] = p.d + begin * (n / kPairs);" in source
    # No C operand and no TMA store: the collective is the only epilogue.
    assert "cutlass::epilogue::collective::CollectiveBuilder" not in source


def test_a_unit_without_a_glu_kernel_has_no_glu_collective():
    assert "cutlass_tune_glu" not in render_unit([KernelConfig(grouping=Grouping.GROUPED)]).source


@pytest.mark.parametrize(("change", "rule"), [
    (dict(epilogue_schedule=EpilogueSchedule.TMA_COOPERATIVE), "grouped_epilogue"),  # the TMA store cannot halve N
    (dict(epilogue_source=True), "grouped_epilogue"),
    (dict(epilogue=Epilogue(activation=Activation.SILU, pair=Pair.SPLIT)), "grouped_operation"),
    (dict(grouping=Grouping.NONE, epilogue_schedule=EpilogueSchedule.TMA_COOPERATIVE), "operation"),
])
def test_the_rules_keep_what_the_glu_collective_builds(change, rule):
    cfg = dataclasses.replace(GROUPED_GLU[0], **change)
    assert rule in [r.rule for r in check_config(cfg)], check_config(cfg)
    with pytest.raises(RenderError):
        render_unit([cfg])


def test_a_split_pair_names_the_weight_layout_to_use():
    cfg = dataclasses.replace(GROUPED_GLU[0], epilogue=Epilogue(activation=Activation.SILU, pair=Pair.SPLIT))
    assert any("interleave_gate_up" in r.reason for r in check_config(cfg))


def test_a_glu_problem_needs_whole_gate_up_pairs_in_n():
    ok = Problem.experts(8, 3072, 4096, 4096, epilogue=SILU_GLU)
    assert check_problem(ok) == []
    bad = Problem.experts(8, 3072 + 8, 4096, 4096, epilogue=SILU_GLU)
    assert "glu_shape" in [r.rule for r in check_problem(bad)]


@pytest.mark.nvcc
def test_glu_kernels_build_match_the_smem_model_and_check_their_arguments(tmp_path):
    results = compile_kernels(GROUPED_GLU, cache=KernelCache(tmp_path), toolchain=find_toolchain(), jobs=1,
                              kernels_per_unit=len(GROUPED_GLU))
    for r in results:
        assert r.status is Status.OK, f"{r.config.name}: {r.reason} (log {r.log_path})"
        assert not r.reason, f"{r.config.name}: {r.reason}"  # e.g. ptxas spilled
    for r in results:
        cfg = r.config
        lib = ctypes.CDLL(str(r.library))
        assert lib.cutlass_tune_abi_version() == ABI_VERSION
        model = smem_usage(cfg)
        assert model.epilogue_bytes == 0
        assert getattr(lib, f"{r.symbol}_stages")() == model.stages, cfg.name
        assert getattr(lib, f"{r.symbol}_shared_storage_bytes")() == model.total_bytes, cfg.name
        kernel = LoadedKernel(r.library, r.symbol)
        problem = Problem.experts(8, 3072, 4096, 4097, **cfg.operation_fields())
        args = make_args(problem, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=SM_COUNT)
        assert kernel.can_implement(args) == 0, cfg.name
        bad = make_args(problem, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=SM_COUNT)
        bad.n = 3072 + 8  # D would hold half a pair
        assert kernel.can_implement(bad) != 0, cfg.name
