"""Real nvcc on fp8 block-wise grouped kernels (CUTLASS 4.2's ptr-array FP8Blockwise mainloop,
one A and one B scale pointer per expert): a cooperative and a ping-pong one build in one unit
without spills, match the grouped smem model with the scales each stage keeps, and their host
checks follow the grouped contract plus whole K blocks of scales.

Runs without a GPU, like test_nvcc_grouped.py: the smem queries, `can_implement` and
`workspace_size` are host code (sm_count given, so no device query).
"""

import ctypes

import pytest

from cutlass_tune.compile import KernelCache, compile_kernels, find_toolchain
from cutlass_tune.kernel import ABI_VERSION, LoadedKernel, make_args
from cutlass_tune.space import (
    DType,
    EpilogueSchedule,
    Grouping,
    KernelConfig,
    KernelSchedule,
    Problem,
    RuntimeArgs,
    Scaling,
    check_config,
    smem_usage,
)
from cutlass_tune.status import Status

FP8_BLOCKWISE = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128, scaling=Scaling.BLOCKWISE,
                     grouping=Grouping.GROUPED)
GROUPED_BLOCKWISE = [
    KernelConfig(**FP8_BLOCKWISE),  # cooperative 128x128x128, C aliasing D
    KernelConfig(**FP8_BLOCKWISE, tile_m=64, epilogue_source=False, kernel_schedule=KernelSchedule.PINGPONG,
                 epilogue_schedule=EpilogueSchedule.TMA),
]
SM_COUNT = 132
DESCRIPTOR = 128  # bytes of one TMA descriptor


def _arrays_bytes(groups: int, source: bool) -> int:
    """The per-group arrays: shapes, A/B/[C]/D pointers, A/B/D strides, A/B scale pointers."""
    round128 = lambda b: -(-b // 128) * 128  # noqa: E731
    return round128(12 * groups) + (4 if source else 3) * round128(8 * groups) + 5 * round128(8 * groups)


@pytest.mark.nvcc
def test_blockwise_grouped_kernels_build_match_the_smem_model_and_check_their_arguments(tmp_path):
    for cfg in GROUPED_BLOCKWISE:
        assert check_config(cfg) == [], cfg.name
    results = compile_kernels(GROUPED_BLOCKWISE, cache=KernelCache(tmp_path), toolchain=find_toolchain(), jobs=1,
                              kernels_per_unit=len(GROUPED_BLOCKWISE))
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
        assert getattr(lib, f"{r.symbol}_mma_n")() == cfg.tile_n, cfg.name

        kernel = LoadedKernel(r.library, r.symbol)
        # Qwen3-30B-A3B's gate_up; the rows need not be a multiple of anything (A's scales are K-major).
        problem = Problem.experts(128, 1536, 2048, 4097, **cfg.operation_fields())
        args = make_args(problem, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=SM_COUNT)
        assert kernel.can_implement(args) == 0, cfg.name
        descriptors = SM_COUNT * DESCRIPTOR * (2 + (1 if cfg.epilogue_source else 0) + 2)
        assert kernel.workspace_size(args) == _arrays_bytes(128, cfg.epilogue_source) + descriptors, cfg.name
        for field, value in [("k", 2048 + 16), ("n", 1536 + 8), ("groups", 0)]:
            bad = make_args(problem, RuntimeArgs(), a=0, b=0, d=0, device_id=0, sm_count=SM_COUNT)
            setattr(bad, field, value)
            assert kernel.can_implement(bad) != 0, (cfg.name, field, value)
