"""Real nvcc on CUTLASS: configs the rules accept build, and the smem model matches them.

Runs in CI (nvcc is there, no GPU): the shared objects load without a GPU and their
constexpr entry points report what CUTLASS computed.
"""

import pytest

from cutlass_tune.compile import find_toolchain
from cutlass_tune.space import (
    DType,
    EpilogueSchedule,
    KernelConfig,
    KernelSchedule,
    Layout,
    TileScheduler,
)

from .conftest import build_and_check_smem

# Boundary configs: the largest fixed stage count that fits, Stream-K, every schedule and
# epilogue, all four layouts, f16 in and f32 out, clusters along either axis.
BOUNDARY = [
    KernelConfig(tile_n=256, cluster_m=2, stages=4, tile_scheduler=TileScheduler.STREAM_K),
    KernelConfig(tile_m=64, tile_n=128, cluster_n=2, kernel_schedule=KernelSchedule.PINGPONG,
                 epilogue_schedule=EpilogueSchedule.NO_SMEM, layout_a=Layout.COL, layout_b=Layout.ROW),
    KernelConfig(stages=7, kernel_schedule=KernelSchedule.TMA_WS, epilogue_schedule=EpilogueSchedule.TMA,
                 layout_a=Layout.COL, layout_b=Layout.COL),
    KernelConfig(tile_m=256, tile_n=64, cluster_m=4, dtype_a=DType.F16, dtype_b=DType.F16,
                 dtype_c=DType.F32, dtype_d=DType.F32, layout_b=Layout.ROW),
    # tile N outside the builder's default wgmma sizes: needs the extended shapes
    KernelConfig(tile_m=256, tile_n=160, epilogue_source=False),
    KernelConfig(tile_m=128, tile_n=224, epilogue_source=False),
    # the most accumulators per thread the rules allow (208)
    KernelConfig(tile_m=128, tile_n=208, kernel_schedule=KernelSchedule.PINGPONG,
                 epilogue_schedule=EpilogueSchedule.TMA, epilogue_source=False),
]


@pytest.mark.nvcc
def test_accepted_boundary_configs_build_and_match_the_smem_model(tmp_path):
    build_and_check_smem(BOUNDARY, tmp_path)


@pytest.mark.nvcc
def test_toolchain_reads_versions():
    tc = find_toolchain()
    assert tc.nvcc_version.count(".") == 2
    assert tc.cutlass_version.startswith("4.")
    assert all(d.is_dir() for d in tc.include_dirs)
    assert "-DNDEBUG" in tc.flags and "-gencode=arch=compute_90a,code=sm_90a" in tc.flags
