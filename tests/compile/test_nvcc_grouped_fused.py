"""Real nvcc on fused grouped kernels: an activation in the ptr-array epilogue (CUTLASS 4.2's
FusionCallbacks of Sm90PtrArrayTmaWarpSpecialized for LinCombEltAct), a cooperative and a
ping-pong one in one unit, built without spills, matching the grouped smem model (an activation
stages nothing), their host checks those of the plain grouped kernels.

Runs without a GPU, like test_nvcc_grouped.py: the queries, `can_implement` and `workspace_size`
are host code (sm_count given, so no device query). tests/compile/test_gpu_grouped_fused.py runs
them against the reference on a GPU.
"""

import ctypes

import pytest

from cutlass_tune.compile import KernelCache, compile_kernels, find_toolchain
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
    Problem,
    RuntimeArgs,
    check_config,
    smem_usage,
)
from cutlass_tune.status import Status

GROUPED_FUSED = [
    KernelConfig(grouping=Grouping.GROUPED, epilogue=Epilogue(activation=Activation.SILU), epilogue_source=False),
    KernelConfig(grouping=Grouping.GROUPED, dtype_a=DType.F16, dtype_b=DType.F16, dtype_c=DType.F16,
                 dtype_d=DType.F16, epilogue=Epilogue(activation=Activation.GELU_TANH), tile_m=64,
                 kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA),
]
SM_COUNT = 132


def test_a_fused_grouped_kernel_renders_the_ptr_array_fusion():
    source = render_unit(GROUPED_FUSED).source
    assert "LinCombEltAct<cutlass::epilogue::thread::SiLu," in source
    assert "LinCombEltAct<cutlass::epilogue::thread::GELU_taylor," in source
    assert source.count("PtrArrayTmaWarpSpecialized") >= 2
    assert source.count("args.epilogue.thread.alpha = p->alpha;") == 2


@pytest.mark.nvcc
def test_fused_grouped_kernels_build_match_the_smem_model_and_check_their_arguments(tmp_path):
    for cfg in GROUPED_FUSED:
        assert check_config(cfg) == [], cfg.name
    results = compile_kernels(GROUPED_FUSED, cache=KernelCache(tmp_path), toolchain=find_toolchain(), jobs=1,
                              kernels_per_unit=len(GROUPED_FUSED))
    for r in results:
        assert r.status is Status.OK, f"{r.config.name}: {r.reason} (log {r.log_path})"
        assert not r.reason, f"{r.config.name}: {r.reason}"  # e.g. ptxas spilled
    for r in results:
        cfg = r.config
        lib = ctypes.CDLL(str(r.library))
        assert lib.cutlass_tune_abi_version() == ABI_VERSION
        model = smem_usage(cfg)
        assert getattr(lib, f"{r.symbol}_stages")() == model.stages, cfg.name
        assert getattr(lib, f"{r.symbol}_shared_storage_bytes")() == model.total_bytes, cfg.name
        kernel = LoadedKernel(r.library, r.symbol)
        problem = Problem.experts(8, 1536, 2048, 4097, **cfg.operation_fields())
        args = make_args(problem, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=SM_COUNT)
        assert kernel.can_implement(args) == 0, cfg.name
        bad = make_args(problem, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=SM_COUNT)
        bad.n = 1536 + 4
        assert kernel.can_implement(bad) != 0, cfg.name
