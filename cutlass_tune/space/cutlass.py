"""What CUTLASS 4.2's SM90 builders make of a config: facts, not rules.

The epilogue's subtile (`epilogue_tile`), the wgmma instruction's N (`wgmma_n`,
`needs_extended_wgmma`), the accumulator registers per thread, the shared memory a kernel takes
(`smem_usage`, exact against nvcc for the kernels tests/compile measures), whether the epilogue
is a fusion (`fused`), and block-wise scaling's granularity (`BLOCKWISE_K`). The render stage
reads them to write the kernel, the prior to describe it (search/_features.py), and the rules
(space/_rules.py) to decide whether CUTLASS builds it; none of them rejects anything.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from ._epilogue import NodeKind
from ._operation import Operation
from ._types import (
    AUTO_EPILOGUE_TILE,
    AUTO_STAGES,
    DType,
    EpilogueSchedule,
    KernelSchedule,
    Scaling,
)

if TYPE_CHECKING:
    from ._knobs import KernelConfig

SMEM_CAPACITY_BYTES = 232448
"""Shared memory per CTA on SM90 (cutlass::arch::sm90_smem_capacity_bytes)."""

KERNEL_SMEM_ALLOWANCE_BYTES = 2048
"""What the kernel adds beyond mainloop and epilogue storage: pipeline barriers, scheduler
storage and padding to the 1024-byte alignment of swizzled tiles. Measured against
`sizeof(SharedStorage)` of compiled kernels (tests/compile/test_nvcc.py)."""


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


@dataclasses.dataclass(frozen=True)
class SmemUsage:
    """Shared memory a config needs, following CUTLASS 4.2's SM90 builders."""

    stages: int
    stage_bytes: int
    epilogue_bytes: int
    epilogue_reuses_mainloop: bool
    """The non-persistent kernel puts epilogue and mainloop tiles in a union."""
    kernel_bytes: int = KERNEL_SMEM_ALLOWANCE_BYTES
    """What the kernel keeps beside the two: the allowance, or a grouped kernel's own count."""

    @property
    def total_bytes(self) -> int:
        mainloop = self.stages * self.stage_bytes
        tensors = (max(mainloop, self.epilogue_bytes) if self.epilogue_reuses_mainloop
                   else mainloop + self.epilogue_bytes)
        return tensors + self.kernel_bytes


def epilogue_tile(cfg: KernelConfig) -> tuple[int, int]:
    """The TMA epilogue's subtile: the override (rows 128 for cooperative, else 64) or what
    EpilogueTileAuto picks (sm90_compute_tile_shape_or_override)."""
    cooperative = cfg.kernel_schedule is KernelSchedule.COOPERATIVE
    if cfg.epilogue_tile_n != AUTO_EPILOGUE_TILE:
        return (128 if cooperative else 64), cfg.epilogue_tile_n
    if cooperative:
        return min(128, cfg.tile_m), math.gcd(min(32, cfg.tile_n), cfg.tile_n)
    n_perf = 64 if cfg.dtype_d.bits == 8 and cfg.tile_n % 64 == 0 else 32
    return min(64, cfg.tile_m), math.gcd(min(n_perf, cfg.tile_n), cfg.tile_n)


WGMMA_N_DEFAULT = (256, 192, 128, 96, 64, 32, 16, 8)
"""The wgmma N sizes CUTLASS's SM90 builder picks from unless the unit defines
CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED (cute/arch/mma_sm90.hpp, ss_op_selector)."""


def wgmma_n(cfg: KernelConfig, *, extended: bool) -> int:
    """N of the wgmma instruction the builder picks for the config's tile: the largest
    available size that divides tile N. With the extended shapes every multiple of 8 up to 256
    is available, so the whole tile N; without, tile N 160 gets 32, tile N 224 gets 32."""
    if extended:
        return cfg.tile_n
    return next(n for n in WGMMA_N_DEFAULT if cfg.tile_n % n == 0)


def accumulator_registers(cfg: KernelConfig) -> int:
    """fp32 accumulator registers per consumer thread: the tile over 128 threads, split between
    two warpgroups by the cooperative schedule (ping-pong and plain kernels hold whole tiles)."""
    warpgroups = 2 if cfg.kernel_schedule is KernelSchedule.COOPERATIVE else 1
    return cfg.tile_m * cfg.tile_n // (128 * warpgroups)


def needs_extended_wgmma(cfg: KernelConfig) -> bool:
    """Whether the unit must enable CUTLASS's extended wgmma shapes for the tile to run as one
    instruction per 64 rows. Without them a 256x160 tile issues five 64x32 wgmmas per k-step
    where one 64x160 would do, and ran at 0.71 of cuBLAS (benchmarks/beat_cublas.md)."""
    return wgmma_n(cfg, extended=False) != cfg.tile_n


def fused(cfg: Operation) -> bool:
    """Whether the epilogue is more than D = alpha * acc + beta * C: a bias, an activation or
    fp8 scales, or a gated product (CUTLASS's fusion operations; a residual alone is its
    LinearCombination)."""
    return any(node.kind not in _LINEAR_COMBINATION or node.scaling is not Scaling.NONE
               for node in cfg.epilogue.tree(cfg.scaling).walk())


_LINEAR_COMBINATION = (NodeKind.ACCUMULATOR, NodeKind.SCALE, NodeKind.RESIDUAL)
"""The nodes of CUTLASS's LinearCombination (alpha * acc + beta * C), alpha being a SCALE of no scaling."""


def epilogue_scales(cfg: Operation) -> bool:
    """Whether the epilogue applies fp8 scales (tensor, rowcol). Block-wise scales are the
    mainloop's: it multiplies each 128-deep K block's partial sums by them."""
    return cfg.scaling in (Scaling.TENSOR, Scaling.ROWCOL)


BLOCKWISE_K = 128
"""Block-wise scaling's granularity along K (A's 1 x 128 groups, B's 128 x 128 blocks) and, as
torch gives B's scales, along N (a kernel may read them finer: `BLOCKWISE_SCALE_N`)."""

BLOCKWISE_SCALE_N = (128, 64, 32)
"""The B scale granularities along N a block-wise kernel may read (`KernelConfig.scale_n`):
torch's 128, or 64 and 32, where the caller's 128 x 128 block scales, each repeated 2 or 4
times along N, make the same scales at a finer granularity, so that tiles 64 or 32 wide can
divide a narrow-M GEMM's N among more CTAs."""


def blockwise_scales_per_tile(cfg: KernelConfig) -> tuple[int, int]:
    """The fp32 scales of the kernel's A and B that one mainloop stage holds (the mainloop's
    ScaleMsPerTile, ScaleNsPerTile): one per row of A's tile and one per scale_n columns of B's;
    swapped (`swap_ab`), one per scale_n rows of its A (the weights, the caller's B) and one per
    column of its B (the tokens, whose scales are per row of the caller's A)."""
    if cfg.swap_ab:
        return cfg.tile_m // cfg.scale_n, cfg.tile_n
    return cfg.tile_m, cfg.tile_n // cfg.scale_n


def blockwise_scale_bytes(cfg: KernelConfig) -> int:
    """The scales one mainloop stage holds, fp32 (compute_stage_count_with_blockwise_scale)."""
    return 4 * sum(blockwise_scales_per_tile(cfg)) if cfg.scaling is Scaling.BLOCKWISE else 0


def broadcast_rows(cfg: KernelConfig) -> tuple[DType, ...]:
    """The per-column vectors the fused epilogue stages in shared memory, one tile-N row each
    (Sm90RowBroadcast): the bias (of D's type; a swapped kernel reads it per row, from global
    memory) and, for per-column fp8 scales, B's (fp32)."""
    rows = (cfg.dtype_d,) if cfg.epilogue.bias and not cfg.swap_ab else ()
    return rows + ((DType.F32,) if cfg.scaling is Scaling.ROWCOL else ())


def epilogue_smem_bytes(cfg: KernelConfig) -> int:
    """sizeof(CollectiveEpilogue::SharedStorage) for the TMA epilogues; 0 without smem."""
    if cfg.epilogue_schedule is EpilogueSchedule.NO_SMEM:
        return 0
    epi_m, epi_n = epilogue_tile(cfg)
    epi_tiles = (cfg.tile_m // epi_m) * (cfg.tile_n // epi_n)
    stages_d = min(epi_tiles, 2)
    reuse_c = cfg.epilogue_source and cfg.dtype_c.bits == cfg.dtype_d.bits and cfg.dtype_d.bits > 8
    stages_c = max(min(epi_tiles, 4), stages_d + 1) if reuse_c else min(epi_tiles, 4)
    elems = epi_m * epi_n
    if not cfg.epilogue_source:  # D's buffers only; the (empty) C load pipeline keeps its barriers
        tensors = stages_d * elems * cfg.dtype_d.bits // 8
    elif reuse_c:
        tensors = stages_c * elems * cfg.dtype_c.bits // 8
    else:
        tensors = _round_up(stages_c * elems * cfg.dtype_c.bits // 8, 1024)
        tensors += stages_d * elems * cfg.dtype_d.bits // 8
    # The fusion's rows follow the collective's tiles (array_aligned, 16 bytes). Measured: a
    # 128x128 bias kernel's and a rowcol fp8 kernel's stages and sizes (tests/compile).
    fusion = sum(_round_up(cfg.tile_n * dtype.bits // 8, 16) for dtype in broadcast_rows(cfg))
    barriers = 2 * 8 * stages_c
    if cfg.swap_ab and cfg.scaling is Scaling.BLOCKWISE:
        # Column-major D: the buffers' swizzle atom spans the subtile's 64 or 128 rows (128 bytes,
        # aligned to 1024), and the fusion's storage after them (a byte where it is empty) and the
        # barriers each round the storage up to that alignment. Measured: ping-pong 64x16 block-wise
        # takes 21 stages, not 22 (tests/compile/test_nvcc_blockwise_swap.py). The row-wise swapped
        # kernels' stages and sizes hold without it (tests/compile/test_nvcc_swap.py), and their
        # kernel allowance would not: their mainloop storage is counted per stage, not per array.
        return _round_up(_round_up(tensors + max(fusion, 1), 1024) + barriers, 1024)
    return _round_up(tensors, 1024) + fusion + barriers


_TMA_DESCRIPTOR_BYTES = 128
_GROUP_SCHEDULER_STAGES = 8
"""The ptr-array kernels' scheduler pipeline depth (its stages and work-tile responses)."""


def smem_usage(cfg: KernelConfig) -> SmemUsage:
    """Stage count (resolving auto the way StageCountAutoCarveout does) and byte counts."""
    a = cfg.tile_m * cfg.tile_k * cfg.dtype_a.bits // 8
    b = cfg.tile_n * cfg.tile_k * cfg.dtype_b.bits // 8
    stage_bytes = _round_up(a + b + blockwise_scale_bytes(cfg), 128) + 16  # + full/empty barrier of PipelineTmaAsync
    epi = epilogue_smem_bytes(cfg)
    if cfg.grouped:
        return _grouped_smem_usage(cfg, stage_bytes, epi)
    if cfg.stages == AUTO_STAGES:
        capacity = SMEM_CAPACITY_BYTES // 128 * 128
        stages = (capacity - _round_up(epi, 128)) // stage_bytes
    else:
        stages = cfg.stages
    kernel_bytes = KERNEL_SMEM_ALLOWANCE_BYTES
    if cfg.scaling is Scaling.BLOCKWISE:
        # The stage count rounds each stage's tiles and scales up to 128 bytes; the storage holds
        # the scales of all stages in two arrays after the tiles: up to 124 bytes a stage less
        # (13 stages of ping-pong 64x64 at scale_n 64 measured 2,672 below the per-stage count).
        kernel_bytes += _mainloop_tensor_bytes(cfg, stages) + 16 * stages - stages * stage_bytes
    return SmemUsage(stages=stages, stage_bytes=stage_bytes, epilogue_bytes=epi,
                     epilogue_reuses_mainloop=cfg.kernel_schedule is KernelSchedule.TMA_WS, kernel_bytes=kernel_bytes)


def _mainloop_tensor_bytes(cfg: KernelConfig, stages: int) -> int:
    """The mainloop's TensorStorage: A's and B's tiles of every stage and, block-wise, the scale
    arrays after them (each 16-byte aligned; the block-wise collectives' smem_SFA, smem_SFB)."""
    tiles = stages * (cfg.tile_m * cfg.dtype_a.bits + cfg.tile_n * cfg.dtype_b.bits) * cfg.tile_k // 8
    if cfg.scaling is not Scaling.BLOCKWISE:
        return tiles
    scales_a, scales_b = blockwise_scales_per_tile(cfg)
    return tiles + _round_up(4 * stages * scales_a, 16) + _round_up(4 * stages * scales_b, 16)


def _grouped_smem_usage(cfg: KernelConfig, stage_bytes: int, epi: int) -> SmemUsage:
    """A ptr-array kernel's shared memory (sm90_gemm_array_tma_warpspecialized_*.hpp): besides
    the dense kernel's it keeps TMA descriptors (A, B, C and one D per consumer warpgroup) that
    it rewrites per group, and the group scheduler's pipeline of 8 work-tile responses. The
    builder carves the A/B descriptors and the scheduler's barriers out of the capacity and
    counts the epilogue's three in the epilogue's SharedStorage. Exact (stages and bytes) for
    the 13 grouped kernels measured with CUTLASS 4.2 (tests/compile/test_nvcc_grouped.py) and
    the block-wise fp8 ones of tests/compile/test_nvcc_grouped_blockwise.py."""
    if cfg.epilogue_schedule is EpilogueSchedule.NO_SMEM:
        return _grouped_no_smem_usage(cfg, stage_bytes)
    epi_tensors = epi // 1024 * 1024  # epilogue_smem_bytes: D (and C) buffers, then barriers (no fusion)
    epi_barriers = epi - epi_tensors
    # The buffers align to their swizzle (8 rows of the swizzle's width), and the empty
    # fusion storage after them takes a byte, so they round up to one more alignment unit.
    row_bytes = epilogue_tile(cfg)[1] * cfg.dtype_d.bits // 8
    swizzle = next(w for w in (128, 64, 32, 16) if row_bytes % w == 0)
    epi_storage = _round_up(epi_tensors + 1, max(8 * swizzle, 128))
    epi_descriptors = 3 * _TMA_DESCRIPTOR_BYTES
    scheduler_barriers = 2 * 8 * _GROUP_SCHEDULER_STAGES
    if cfg.stages == AUTO_STAGES:
        capacity = (SMEM_CAPACITY_BYTES - 2 * _TMA_DESCRIPTOR_BYTES - scheduler_barriers) // 128 * 128
        carveout = _round_up(epi_storage + epi_descriptors + epi_barriers, max(8 * swizzle, 128))
        stages = (capacity - _round_up(carveout, 128)) // stage_bytes
    else:
        stages = cfg.stages
    order_barriers = 16 + (32 if cfg.kernel_schedule is KernelSchedule.PINGPONG else 0)
    pipelines = scheduler_barriers + 16 * stages + epi_barriers + order_barriers
    responses = 16 * _GROUP_SCHEDULER_STAGES
    # The epilogue's buffers follow the mainloop's at their alignment, the largest of the kernel's
    # storage (16-bit tiles fill whole units of it; block-wise scales leave a remainder).
    mainloop = _round_up(_mainloop_tensor_bytes(cfg, stages), max(8 * swizzle, 128))
    front = _round_up(mainloop + epi_storage + pipelines + responses, 128)
    total = _round_up(front + 2 * _TMA_DESCRIPTOR_BYTES + epi_descriptors, max(8 * swizzle, 128))
    return SmemUsage(stages=stages, stage_bytes=stage_bytes, epilogue_bytes=epi, epilogue_reuses_mainloop=False,
                     kernel_bytes=total - stages * stage_bytes - epi)



def _grouped_no_smem_usage(cfg: KernelConfig, stage_bytes: int) -> SmemUsage:
    """A ptr-array kernel whose epilogue stores from the registers (the GLU collective, under
    CUTLASS's Sm90TmaWarpSpecializedAdapter): its storage and its tensor maps are empty structs
    (a byte each, padded to the kernel's 128-byte units), and it adds no barriers. Exact for the
    two kernels of tests/compile/test_nvcc_grouped_glu.py (cooperative 128x192: 5 stages,
    205,696 bytes; ping-pong 64x128: 9 stages, 222,208)."""
    scheduler_barriers = 2 * 8 * _GROUP_SCHEDULER_STAGES
    if cfg.stages == AUTO_STAGES:
        capacity = (SMEM_CAPACITY_BYTES - 2 * _TMA_DESCRIPTOR_BYTES - scheduler_barriers) // 128 * 128
        stages = (capacity - 128) // stage_bytes  # StageCountAutoCarveout of the 1-byte storage
    else:
        stages = cfg.stages
    order_barriers = 16 + (32 if cfg.kernel_schedule is KernelSchedule.PINGPONG else 0)
    pipelines = scheduler_barriers + 16 * stages + order_barriers
    responses = 16 * _GROUP_SCHEDULER_STAGES
    tensors = _round_up(_mainloop_tensor_bytes(cfg, stages) + 1, 128)
    tensor_maps = 2 * _TMA_DESCRIPTOR_BYTES + 128
    total = _round_up(tensors + pipelines + responses + tensor_maps, 128)
    return SmemUsage(stages=stages, stage_bytes=stage_bytes, epilogue_bytes=0, epilogue_reuses_mainloop=False,
                     kernel_bytes=total - stages * stage_bytes)
