"""Weight-gradient grouped kernels (`Grouping.GROUPED_K`): dW_e = G_e^T X_e, each group's GEMM
(N, K, rows of expert e), rendered by templates/gemm_sm90_grouped_kernel.cu.j2's `grouped_k` block.

The render and the rules run on a CPU; the `nvcc` test builds a cooperative and a ping-pong kernel
in one unit with real nvcc for sm_90a (no GPU: the queries and `can_implement` are host code).
tests/compile/test_gpu_grouped_k.py runs them against torch on a GPU.
"""

import ctypes
import dataclasses

import pytest

from cutlass_tune.compile import KernelCache, compile_kernels, find_toolchain
from cutlass_tune.errors import RenderError
from cutlass_tune.kernel import ABI_VERSION, LoadedKernel, make_args
from cutlass_tune.render import render_unit
from cutlass_tune.space import (
    Activation,
    DType,
    Epilogue,
    EpilogueSchedule,
    Grouping,
    KernelConfig,
    KernelSchedule,
    Layout,
    Problem,
    RuntimeArgs,
    check_config,
    check_problem,
    smem_usage,
)
from cutlass_tune.status import Status

WGRAD = dict(grouping=Grouping.GROUPED_K, layout_a=Layout.COL, layout_b=Layout.ROW, epilogue_source=False)
GROUPED_K = [
    KernelConfig(**WGRAD),  # cooperative 128x128x64
    KernelConfig(**WGRAD, tile_m=64, tile_n=128, kernel_schedule=KernelSchedule.PINGPONG,
                 epilogue_schedule=EpilogueSchedule.TMA),
]
SM_COUNT = 132


def test_the_weight_gradient_kernels_are_valid_and_render_the_k_grouped_builder():
    for cfg in GROUPED_K:
        assert check_config(cfg) == [], cfg.name
    source = render_unit(GROUPED_K).source
    assert source.count("using LayoutA = cutlass::layout::ColumnMajor;") == 2
    assert source.count("using LayoutB = cutlass::layout::RowMajor;") == 2
    # Each group's rows are its K; its A and B start at its first row of G and of X.
    assert source.count("p.arrays.shapes[e] = GroupShape{rows > 0 ? p.n : 0, p.k, static_cast<int>(rows)};") == 2
    assert source.count("p.arrays.a[e] = p.a + begin * n;") == 2
    assert source.count("p.arrays.b[e] = p.b + begin * k;") == 2
    assert source.count("build_group_arguments<<<dim3(kZeroBlocks, b.groups)") == 2
    assert "KernelPtrArrayTmaWarpSpecializedPingpong" in source


def test_a_forward_grouped_unit_keeps_its_builder():
    source = render_unit([KernelConfig(grouping=Grouping.GROUPED)]).source
    assert "kZeroBlocks" not in source
    assert "p.arrays.a[e] = p.a + begin * k;" in source


@pytest.mark.parametrize(("change", "rule"), [
    (dict(epilogue_source=True), "grouped_epilogue"),  # empty experts are zeroed, not accumulated into
    (dict(layout_a=Layout.ROW, layout_b=Layout.COL), "grouped_operation"),
    (dict(epilogue=Epilogue(activation=Activation.SILU)), "grouped_operation"),
    (dict(dtype_d=DType.F32, dtype_c=DType.F32), "grouped_operation"),
    (dict(kernel_schedule=KernelSchedule.TMA_WS, epilogue_schedule=EpilogueSchedule.TMA), "grouped_schedule"),
])
def test_the_rules_keep_what_the_weight_gradient_kernel_builds(change, rule):
    cfg = dataclasses.replace(GROUPED_K[0], **change)
    assert rule in [r.rule for r in check_config(cfg)], check_config(cfg)
    with pytest.raises(RenderError):
        render_unit([cfg])


def test_a_weight_gradient_problem_needs_aligned_n_and_k_but_any_rows():
    ok = Problem.experts(8, 1536, 4096, 4097, group_rows=(0, 1, 2, 4094, 0, 0, 0, 0),
                         layout_a=Layout.COL, layout_b=Layout.ROW, grouping=Grouping.GROUPED_K)
    assert check_problem(ok) == []
    for n, k in ((1536 + 4, 4096), (1536, 4096 + 4)):
        bad = dataclasses.replace(ok, n=n, k=k)
        assert "tma_alignment" in [r.rule for r in check_problem(bad)], (n, k)


@pytest.mark.nvcc
def test_weight_gradient_kernels_build_match_the_smem_model_and_check_their_arguments(tmp_path):
    results = compile_kernels(GROUPED_K, cache=KernelCache(tmp_path), toolchain=find_toolchain(), jobs=1,
                              kernels_per_unit=len(GROUPED_K))
    for r in results:
        assert r.status is Status.OK, f"{r.config.name}: {r.reason} (log {r.log_path})"
        assert not r.reason, f"{r.config.name}: {r.reason}"  # e.g. ptxas spilled
    for r in results:
        cfg = r.config
        lib = ctypes.CDLL(str(r.library))
        assert lib.cutlass_tune_abi_version() == ABI_VERSION
        model = smem_usage(cfg)
        assert getattr(lib, f"{r.symbol}_stages")() == model.stages, cfg.name
        assert getattr(lib, f"{r.symbol}_shared_storage_bytes")() <= model.total_bytes, cfg.name
        kernel = LoadedKernel(r.library, r.symbol)
        problem = Problem.experts(8, 1536, 4096, 4097, **cfg.operation_fields())
        args = make_args(problem, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=SM_COUNT)
        assert kernel.can_implement(args) == 0, cfg.name
        bad = make_args(problem, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=SM_COUNT)
        bad.k = 4096 + 4  # X's and dW's rows would start off 16 bytes
        assert kernel.can_implement(bad) != 0, cfg.name
