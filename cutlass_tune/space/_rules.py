"""Static validity rules: the one place that decides whether CUTLASS can build a config.

Every rule returns `Rejection`s with a stable rule id and a reason a person can act on. A config
with no rejection is expected to compile; the tests hold that claim against real nvcc. Where
CUTLASS would accept a value we have not verified, we reject it and say so: a rule that is too
strict costs a config, one that is too loose costs a 30-second compile and a confusing error.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._epilogue import Activation, Epilogue, NodeKind, Pair, unrendered
from ._operation import MAX_GROUPS, Operation, Problem
from ._types import (
    AUTO_EPILOGUE_TILE,
    AUTO_STAGES,
    PAIRED_EPILOGUE,
    Decomposition,
    DType,
    EpilogueSchedule,
    Grouping,
    KernelSchedule,
    Layout,
    Routing,
    Scaling,
    TileScheduler,
)

if TYPE_CHECKING:  # _knobs declares each knob with its rule from here
    from ._knobs import KernelConfig, RuntimeArgs

SMEM_CAPACITY_BYTES = 232448
"""Shared memory per CTA on SM90 (cutlass::arch::sm90_smem_capacity_bytes)."""

KERNEL_SMEM_ALLOWANCE_BYTES = 2048
"""What the kernel adds beyond mainloop and epilogue storage: pipeline barriers, scheduler
storage and padding to the 1024-byte alignment of swizzled tiles. Measured against
`sizeof(SharedStorage)` of compiled kernels (tests/compile/test_nvcc.py)."""

TMA_ALIGNMENT_BYTES = 16
MAX_CLUSTER_CTAS = 8
MAX_FIXED_STAGES = 16
SWIZZLE_VALUES = (1, 2, 4, 8)
MAX_SPLITS = 32
MAX_PROBLEM_DIM = 2**31 - 1
"""Largest M, N or K: the kernels' problem shape is `Shape<int, int, int, int>`, filled with
`static_cast<int>` of the ABI's int64 sizes (templates/gemm_sm90_kernel.cu.j2), so a larger size
would wrap. Strides are int64, so no element count overflows below this bound."""
SUPPORTED_INPUTS = (DType.BF16, DType.F16, DType.E4M3, DType.E5M2)
SUPPORTED_OUTPUTS = (DType.BF16, DType.F16, DType.F32)
FP8_PROMOTION_INTERVAL = 4
"""k-steps between promotions of the fp8 accumulator to fp32 without fast accumulation (the
default `mma_promotion_interval` of CUTLASS's SM90 fp8 mainloop, which we do not set)."""
FP8_MMA_K = 32
"""K of one fp8 wgmma instruction (32 bytes)."""
MAX_ACCUMULATOR_REGISTERS = 208
"""fp32 accumulators per consumer thread above which we do not build a kernel. The consumer
warpgroups of the persistent kernels get 232 registers (setmaxnreg). ptxas
(benchmarks/accumulator_spills.py): 176, 192 and 208 build without spills (208 also with a C
operand); 224 stores and loads 3.3-3.4 KB of spills per thread (6.6 KB in all), and every
committed kernel above 208 ran at 0.05-0.33 of cuBLAS. At 208, ping-pong 128x208 was the best
kernel, or tied for it, on LLaMA-33B's 6656-wide GEMMs on an H100 (1.044-1.054 of cuBLAS
confirmed; benchmarks/beat_cublas.md)."""


@dataclasses.dataclass(frozen=True)
class Rejection:
    """Why a config, problem or run-time variant cannot be used."""

    rule: str
    reason: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.reason}"


# Per-value rules: a value that fails one of these is wrong in every combination, so a config
# file that lists it is malformed rather than merely containing invalid configs. Each knob's
# declaration (space/_knobs.py) names its rule.

def tile_m_problem(v: int) -> str | None:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0 or v % 64 or v > 256:
        return "tile M must be a multiple of 64 between 64 and 256 (one or more 64-row wgmma atoms)"
    return None


def tile_n_problem(v: int) -> str | None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 16 or v % 16 or v > 256:
        return "tile N must be a multiple of 16 between 16 and 256 (wgmma N range)"
    return None


def tile_k_problem(v: int) -> str | None:
    if not isinstance(v, int) or isinstance(v, bool) or v not in (32, 64, 128, 256):
        return "tile K must be 32, 64, 128 or 256 (whole 64-, 128- or 256-byte smem swizzle rows)"
    return None


def cluster_dim_problem(v: int) -> str | None:
    if not isinstance(v, int) or isinstance(v, bool) or v not in (1, 2, 4, 8):
        return "cluster M and N must each be 1, 2, 4 or 8"
    return None


def stages_problem(v: int) -> str | None:
    if not isinstance(v, int) or isinstance(v, bool) or not (
        v == AUTO_STAGES or 2 <= v <= MAX_FIXED_STAGES
    ):
        return f"stages must be auto or a number from 2 to {MAX_FIXED_STAGES} (a pipeline needs 2)"
    return None


def swizzle_problem(v: int) -> str | None:
    if not isinstance(v, int) or isinstance(v, bool) or v not in SWIZZLE_VALUES:
        return "swizzle must be 1, 2, 4 or 8"
    return None


def splits_problem(v: int) -> str | None:
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_SPLITS:
        return f"splits must be a number from 1 to {MAX_SPLITS}"
    return None


def problem_dim_problem(v: int) -> str | None:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= MAX_PROBLEM_DIM:
        return (f"a problem size must be a whole number from 1 to {MAX_PROBLEM_DIM} (M, N and K "
                f"are 32-bit ints in CUTLASS's problem shape)")
    return None


def _flag_rule(name: str) -> Callable[[bool], str | None]:
    """The per-value rule of a true/false knob: a bool, never a truthy string or number."""
    def problem(v: bool) -> str | None:
        return None if type(v) is bool else f"{name} must be true or false"
    return problem


fp8_fast_accum_problem = _flag_rule("fp8_fast_accum")
epilogue_source_problem = _flag_rule("epilogue_source")
swap_ab_problem = _flag_rule("swap_ab")


def swap_ab_operation_problem(cfg: Operation) -> str | None:
    """Why an operation has no A/B-swapped kernel, or None: the swap is built for fp8 with
    row-wise scales (A's row scales become the swapped problem's column scales and B's its
    row scales) or block-wise scales (B's block scales become the swapped mainloop's A scales,
    one per tile M, and A's 1 x 128 group scales its B scales, one per column), and an epilogue
    of a bias and an activation at most (the bias becomes a column broadcast; a residual or gate
    would read C transposed, which is not verified), not grouped."""
    if not (_fp8_inputs(cfg.dtype_a, cfg.dtype_b) and cfg.scaling in (Scaling.ROWCOL, Scaling.BLOCKWISE)):
        return "swap_ab is built for fp8 inputs with rowcol or blockwise scaling only"
    if cfg.epilogue.residual or cfg.epilogue.gated:
        return "swap_ab takes a bias and an activation at most (no residual or gated epilogue)"
    if cfg.grouping is not Grouping.NONE:
        return "swap_ab is not built for grouped kernels"
    return None


def epilogue_tile_n_problem(v: int) -> str | None:
    if not isinstance(v, int) or isinstance(v, bool) or not (
        v == AUTO_EPILOGUE_TILE or (16 <= v <= 256 and v % 16 == 0)
    ):
        return "epilogue tile N must be auto or a multiple of 16 between 16 and 256"
    return None


def _fp8_inputs(a: DType, b: DType) -> bool:
    return a.is_fp8 and b.is_fp8


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


def scale_n_problem(v: int) -> str | None:
    if not isinstance(v, int) or isinstance(v, bool) or v not in BLOCKWISE_SCALE_N:
        return "scale_n (B's block-wise scale granularity along N) must be 128, 64 or 32"
    return None


BLOCKWISE_SWAP_TILE_N = (16, 32, 64, 128)
"""The tile N (tokens, the caller's M) of an A/B-swapped block-wise kernel: the widths nvcc built
here without spills (tests/compile/test_nvcc_blockwise_swap.py)."""


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
    if cfg.grouping is Grouping.GROUPED:
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


_EPILOGUE_PAIRS = {schedule: (epilogue, EpilogueSchedule.NO_SMEM)
                   for schedule, epilogue in PAIRED_EPILOGUE.items()}


def check_config(cfg: KernelConfig) -> list[Rejection]:
    """All reasons CUTLASS 4.2 on sm90a cannot build `cfg` (empty when it can)."""
    out = check_operands(cfg)
    for knob in cfg.knobs:
        for field, problem in knob.problems(cfg):
            out.append(Rejection(field, problem))
    if out:
        return out  # the combination rules below assume sane values
    return check_combinations(cfg)


def check_operands(cfg: KernelConfig) -> list[Rejection]:
    """The reasons `check_config` gives first: the arch and the operand and accumulator types."""
    out: list[Rejection] = []

    def reject(rule: str, reason: str) -> None:
        out.append(Rejection(rule, reason))

    if cfg.arch != "sm90a":
        reject("arch", f"arch {cfg.arch!r} is not supported; only sm90a")
    if cfg.dtype_a not in SUPPORTED_INPUTS or cfg.dtype_b not in SUPPORTED_INPUTS:
        reject("dtype_inputs", "A and B must be bf16, f16 or fp8 (e4m3, e5m2)")
    elif cfg.dtype_a.is_fp8 != cfg.dtype_b.is_fp8:
        reject("dtype_inputs", "A and B must both be fp8 or both 16-bit (mixed-width inputs are not supported)")
    elif cfg.dtype_a != cfg.dtype_b and not _fp8_inputs(cfg.dtype_a, cfg.dtype_b):
        reject("dtype_inputs", "A and B must have the same element type")
    if cfg.dtype_d not in SUPPORTED_OUTPUTS or cfg.dtype_c != cfg.dtype_d:
        reject("dtype_output", "C and D must have the same type, one of bf16, f16, f32")
    if cfg.dtype_acc != DType.F32:
        reject("dtype_accumulator", "the accumulator must be f32")
    operation = operation_problem(cfg.epilogue, cfg.scaling)
    if operation:
        reject("operation", operation)
    elif cfg.scaling is not Scaling.NONE and not _fp8_inputs(cfg.dtype_a, cfg.dtype_b):
        reject("scaling_inputs", SCALING_INPUTS_REASON)
    return out


SCALING_INPUTS_REASON = ("fp8 scales (scaling tensor, rowcol or blockwise) apply to fp8 inputs (e4m3, e5m2) "
                         "only; a 16-bit GEMM scales by alpha")


def operation_problem(epilogue: object, scaling: object) -> str | None:
    """Whether an epilogue and a scaling are values of their types (they reach the C++)."""
    if not (isinstance(epilogue, Epilogue) and type(epilogue.bias) is bool and type(epilogue.residual) is bool
            and type(epilogue.gated) is bool and isinstance(epilogue.activation, Activation)
            and isinstance(epilogue.pair, Pair) and type(epilogue.row_scale) is bool):
        return (f"epilogue must be an Epilogue of bias, activation, residual, gated, pair and row_scale, "
                f"not {epilogue!r:.60}")
    why = epilogue.problem()
    if why:
        return f"epilogue: {why}"
    missing = unrendered(epilogue.tree(), Grouping.NONE)
    if missing:
        return (f"epilogue {epilogue.name}: its {', '.join(k.value for k in missing)} node is declared but no "
                "kernel renders it yet")
    if not isinstance(scaling, Scaling):
        return f"scaling must be one of {', '.join(s.value for s in Scaling)}, not {scaling!r:.60}"
    return None


def check_combinations(cfg: KernelConfig) -> list[Rejection]:
    """The reasons `check_config` gives for a config of supported operands whose every value
    passes its own rule (it checks those first): the rules across knobs."""
    out: list[Rejection] = []

    def reject(rule: str, reason: str) -> None:
        out.append(Rejection(rule, reason))

    if cfg.tile_k * cfg.dtype_a.bits // 8 not in (64, 128, 256):
        reject("tile_k_bytes", f"tile K x element size must be 64, 128 or 256 bytes; "
               f"{cfg.tile_k} x {cfg.dtype_a.bits // 8} is not")
    fp8 = _fp8_inputs(cfg.dtype_a, cfg.dtype_b)
    if fp8 and (cfg.layout_a, cfg.layout_b) != (Layout.ROW, Layout.COL):
        reject("fp8_layout", "fp8 inputs need layout tn (A row-major, B column-major): wgmma reads "
               "8-bit operands K-major only, and CUTLASS's register-transposing path for other "
               "layouts is not supported here")
    if cfg.fp8_fast_accum and not fp8:
        reject("fp8_fast_accum", "fp8_fast_accum applies to fp8 inputs only (the FP8FastAccum "
               "kernel schedules)")
    if fp8 and not cfg.fp8_fast_accum and FP8_PROMOTION_INTERVAL % (cfg.tile_k // FP8_MMA_K):
        reject("fp8_promotion", f"without fast accumulation fp8 promotes to fp32 every "
               f"{FP8_PROMOTION_INTERVAL} wgmma k-steps, which must be whole tiles; tile K "
               f"{cfg.tile_k} takes {cfg.tile_k // FP8_MMA_K} steps of {FP8_MMA_K} "
               f"(can_implement refuses it): use tile K 64 or 128, or fp8_fast_accum")
    if cfg.scaling is Scaling.BLOCKWISE:
        out.extend(_blockwise_rejections(cfg))
    if cfg.scale_n != BLOCKWISE_K and (cfg.scaling is not Scaling.BLOCKWISE or cfg.grouping is Grouping.GROUPED):
        reject("blockwise_scale_n", f"scale_n {cfg.scale_n} (B's scale granularity along N) applies to dense "
               f"block-wise kernels only: leave it at {BLOCKWISE_K} (grouped kernels read the MoE code's "
               f"128 x 128 block scales as they are)")
    if cfg.swap_ab and (swap := swap_ab_operation_problem(cfg)):
        reject("swap_ab", swap)
    if cfg.cluster_m * cfg.cluster_n > MAX_CLUSTER_CTAS:
        reject("cluster_size", f"cluster {cfg.cluster_m}x{cfg.cluster_n} has more than "
               f"{MAX_CLUSTER_CTAS} CTAs (the portable limit)")
    if cfg.kernel_schedule is KernelSchedule.COOPERATIVE and cfg.tile_m % 128:
        reject("cooperative_tile_m", "cooperative splits tile M over two consumer warpgroups "
               "of 64 rows: tile M must be 128 or 256")
    elif (registers := accumulator_registers(cfg)) > MAX_ACCUMULATOR_REGISTERS:
        reject("accumulator_registers", f"a {cfg.tile_m}x{cfg.tile_n} tile puts "
               f"{registers} fp32 accumulators in each {cfg.kernel_schedule.value} "
               f"consumer thread; above {MAX_ACCUMULATOR_REGISTERS} ptxas spills them and the "
               f"kernel runs at a fraction of cuBLAS (use a smaller tile, or cooperative)")
    if cfg.epilogue_schedule not in _EPILOGUE_PAIRS[cfg.kernel_schedule]:
        allowed = ", ".join(e.value for e in _EPILOGUE_PAIRS[cfg.kernel_schedule])
        reject("epilogue_pairing", f"epilogue {cfg.epilogue_schedule.value} does not pair with "
               f"the {cfg.kernel_schedule.value} schedule (use {allowed})")
    if cfg.tile_scheduler is TileScheduler.STREAM_K and cfg.kernel_schedule is not KernelSchedule.COOPERATIVE:
        reject("stream_k_schedule", "Stream-K runs only with the cooperative schedule")
    tma_epilogue = cfg.epilogue_schedule is not EpilogueSchedule.NO_SMEM
    if cfg.epilogue_tile_n != AUTO_EPILOGUE_TILE and not tma_epilogue:
        reject("epilogue_tile", "an epilogue tile applies to the TMA epilogues only")
    elif cfg.epilogue_tile_n != AUTO_EPILOGUE_TILE and cfg.tile_n % cfg.epilogue_tile_n:
        reject("epilogue_tile", f"epilogue tile N {cfg.epilogue_tile_n} does not divide tile N "
               f"{cfg.tile_n}")
    if not cfg.epilogue_source and not tma_epilogue:
        reject("epilogue_source", "a kernel without a C operand is built here with the TMA "
               "epilogues only (no_smem without C is not verified)")
    if cfg.epilogue.residual and not cfg.epilogue_source:
        reject("residual_source", "a residual epilogue reads C: it needs epilogue_source true")
    if cfg.epilogue.gated and not cfg.epilogue_source:
        reject("residual_source", "a gated epilogue reads the gate from C: it needs epilogue_source true")
    if cfg.scaling is Scaling.BLOCKWISE and not fused(cfg) and not tma_epilogue:
        reject("fusion_schedule", "block-wise kernels are built with the TMA epilogues only (the no_smem "
               "epilogue after the block-wise mainloop is not verified): use tma or tma_cooperative")
    elif fused(cfg) and not tma_epilogue:
        reject("fusion_schedule", f"the {cfg.epilogue.name} epilogue"
               + (f" with {cfg.scaling.value} scaling" if cfg.scaling is not Scaling.NONE else "")
               + " is a fusion CUTLASS builds on the TMA epilogues only (no_smem takes a plain "
               "linear combination): use tma or tma_cooperative")

    if cfg.grouping is Grouping.GROUPED:
        out.extend(_grouped_rejections(cfg))

    usage = smem_usage(cfg)
    if usage.stages < 2:
        reject("smem_stages", f"only {usage.stages} stage of {usage.stage_bytes} bytes fits beside "
               f"the {usage.epilogue_bytes}-byte epilogue; a pipeline needs 2")
    elif usage.total_bytes > SMEM_CAPACITY_BYTES:
        reject("smem_capacity", f"{usage.stages} stages x {usage.stage_bytes} bytes with a "
               f"{usage.epilogue_bytes}-byte epilogue need {usage.total_bytes} bytes of shared "
               f"memory (kernel allowance included); the SM has {SMEM_CAPACITY_BYTES}")
    return out


def _blockwise_rejections(cfg: KernelConfig) -> list[Rejection]:
    """What CUTLASS 4.2's block-wise fp8 mainloop (KernelTmaWarpSpecialized{Cooperative,
    Pingpong}FP8Blockwise, and its ptr-array form for grouped kernels) builds, measured with nvcc
    (tests/compile/test_nvcc_grouped_blockwise.py; the dense suite's store holds the same compile
    errors and spills): its static_asserts on the tile, room for its second accumulator, its two
    schedules."""
    out = []
    if cfg.tile_k != BLOCKWISE_K:
        out.append(Rejection("blockwise_tile", f"block-wise scaling applies B's scales every {BLOCKWISE_K} K: "
                             f"the mainloop needs tile K {BLOCKWISE_K} (promotes every 4 wgmma k-steps), "
                             f"not {cfg.tile_k}"))
    elif cfg.swap_ab and cfg.tile_m != cfg.scale_n:
        out.append(Rejection("blockwise_tile", f"a swapped block-wise kernel's tile M runs over the weights' N "
                             f"and takes one of their scale blocks: tile M {cfg.scale_n} (scale_n), not "
                             f"{cfg.tile_m} (ping-pong 64 with scale_n 64, cooperative 128 with scale_n 128)"))
    elif cfg.swap_ab and cfg.tile_n not in BLOCKWISE_SWAP_TILE_N:
        out.append(Rejection("blockwise_tile", f"a swapped block-wise kernel's tile N runs over the tokens, one "
                             f"scale per column: {', '.join(map(str, BLOCKWISE_SWAP_TILE_N))} (built with nvcc "
                             f"here), not {cfg.tile_n}"))
    elif not cfg.swap_ab and cfg.tile_n != cfg.scale_n:
        out.append(Rejection("blockwise_tile", f"the block-wise mainloop takes one B scale block per tile: tile "
                             f"N {cfg.scale_n} (scale_n), not {cfg.tile_n} (tile N 256 with scale_n 128 fails its "
                             f"static_assert \"Accumulator and scaleB must have same shape\"); tile N 64 or 32 "
                             f"takes scale_n of the same"))
    elif (registers := 2 * accumulator_registers(cfg)) > MAX_ACCUMULATOR_REGISTERS:
        out.append(Rejection("blockwise_registers", f"the block-wise mainloop keeps a second fp32 accumulator "
                             f"of the tile (it adds each 128-deep K block's scaled sums to the first): a "
                             f"{cfg.tile_m}x{cfg.tile_n} {cfg.kernel_schedule.value} tile holds {registers} per "
                             f"consumer thread, above {MAX_ACCUMULATOR_REGISTERS}, and ptxas spills them "
                             f"(ping-pong 128x128 and cooperative 256x128 did): use cooperative 128x128 or "
                             f"ping-pong 64x128"))
    if cfg.kernel_schedule is KernelSchedule.TMA_WS or cfg.fp8_fast_accum:
        out.append(Rejection("blockwise_schedule", "block-wise scaling has its own cooperative and ping-pong "
                             "schedules (no tma_ws, and no fp8_fast_accum: it promotes every 128 K)"))
    if cfg.stages != AUTO_STAGES:
        out.append(Rejection("blockwise_stages", f"the block-wise builder counts its own stages: stages auto, not "
                             f"{cfg.stages} (compute_stage_count_with_blockwise_scale takes no StageCount; nvcc "
                             f"here, and the suite's 64x128x128 4x2 s2 in its store, failed to compile)"))
    return out


def grouped_operation_problem(op: Operation) -> str | None:
    """Why no grouped kernel computes `op`, or None. Two are built: bf16 or f16 in and the same
    type out, and fp8 e4m3 in with block-wise scales and bf16 out (the forward of fp8 MoE experts,
    DeepSeek-V3's recipe: CUTLASS 4.2's ptr-array FP8Blockwise mainloop, one scale pointer of A
    and one of B per expert), every other fp8 grouping refused. The epilogue's nodes are those a
    grouped kernel renders (`NODES`: an activation, through the ptr-array LinCombEltAct), on
    16-bit inputs; the fp8 one takes the plain epilogue."""
    missing = unrendered(op.epilogue.tree(), Grouping.GROUPED)
    if missing:
        return (f"a grouped GEMM's epilogue takes an activation at most: its {', '.join(k.value for k in missing)} "
                "node is not built for grouped kernels")
    if not op.epilogue.is_plain and _fp8_inputs(op.dtype_a, op.dtype_b):
        return "an fp8 grouped GEMM takes the plain epilogue (fused fp8 grouped kernels are not built)"
    if _fp8_inputs(op.dtype_a, op.dtype_b):
        if (op.dtype_a, op.dtype_b, op.scaling) != (DType.E4M3, DType.E4M3, Scaling.BLOCKWISE):
            return ("an fp8 grouped GEMM is built for e4m3 inputs with block-wise scales only (no "
                    f"e5m2, no tensor or rowcol scales, no unscaled fp8), not {op.dtype_a.value} x "
                    f"{op.dtype_b.value} with scaling {op.scaling.value}")
        if op.dtype_d is not DType.BF16:
            return f"an fp8 grouped GEMM gives a bf16 D (the fp8 MoE recipe's), not {op.dtype_d.value}"
        return None
    if op.scaling is not Scaling.NONE or op.dtype_d is not op.dtype_a:
        return ("a 16-bit grouped GEMM takes bf16 or f16 inputs and gives D of the same type, "
                "unscaled")
    return None


def _grouped_rejections(cfg: KernelConfig) -> list[Rejection]:
    """What a grouped (ptr-array) kernel cannot be: CUTLASS 4.2 has the ptr-array mainloop for the
    cooperative and ping-pong schedules only, with its own persistent group scheduler."""
    out = []
    if cfg.kernel_schedule is KernelSchedule.TMA_WS or cfg.tile_scheduler is not TileScheduler.PERSISTENT:
        out.append(Rejection("grouped_schedule", "a grouped kernel runs the ptr-array cooperative or "
                             "ping-pong schedule with the persistent group scheduler (no tma_ws, no "
                             "Stream-K)"))
    why = grouped_operation_problem(cfg)
    if why:
        out.append(Rejection("grouped_operation", why))
    if cfg.epilogue_schedule is EpilogueSchedule.NO_SMEM:
        out.append(Rejection("grouped_epilogue", "a grouped kernel takes the ptr-array TMA epilogue "
                             "(tma with ping-pong, tma_cooperative with cooperative)"))
    return out


_SMEM_READS = ("dtype_a", "dtype_b", "dtype_c", "dtype_d", "tile_m", "tile_n", "tile_k", "stages",
               "kernel_schedule", "epilogue_schedule", "epilogue_tile_n", "epilogue_source", "epilogue",
               "scaling", "scale_n", "swap_ab")

CONFIG_RULES: tuple[tuple[str, frozenset[str]], ...] = tuple((rule, frozenset(reads)) for rule, reads in (
    ("arch", ("arch",)),
    ("dtype_inputs", ("dtype_a", "dtype_b")),
    ("dtype_output", ("dtype_c", "dtype_d")),
    ("dtype_accumulator", ("dtype_acc",)),
    ("operation", ("epilogue", "scaling")),
    ("scaling_inputs", ("scaling", "dtype_a", "dtype_b")),
    ("tile_k_bytes", ("tile_k", "dtype_a")),
    ("fp8_layout", ("dtype_a", "dtype_b", "layout_a", "layout_b")),
    ("fp8_fast_accum", ("fp8_fast_accum", "dtype_a", "dtype_b")),
    ("fp8_promotion", ("fp8_fast_accum", "dtype_a", "dtype_b", "tile_k")),
    ("blockwise_tile", ("scaling", "tile_k", "tile_n", "scale_n", "tile_m", "swap_ab")),
    ("blockwise_schedule", ("scaling", "kernel_schedule", "fp8_fast_accum")),
    ("blockwise_stages", ("scaling", "stages")),
    ("blockwise_scale_n", ("scale_n", "scaling", "grouping")),
    ("swap_ab", ("swap_ab", "dtype_a", "dtype_b", "scaling", "epilogue", "grouping")),
    ("cluster_size", ("cluster_m", "cluster_n")),
    ("cooperative_tile_m", ("kernel_schedule", "tile_m")),
    ("accumulator_registers", ("kernel_schedule", "tile_m", "tile_n")),
    ("epilogue_pairing", ("kernel_schedule", "epilogue_schedule")),
    ("stream_k_schedule", ("tile_scheduler", "kernel_schedule")),
    ("epilogue_tile", ("epilogue_tile_n", "epilogue_schedule", "tile_n")),
    ("epilogue_source", ("epilogue_source", "epilogue_schedule")),
    ("residual_source", ("epilogue", "epilogue_source")),
    ("fusion_schedule", ("epilogue", "scaling", "epilogue_schedule")),
    ("grouped_schedule", ("grouping", "kernel_schedule", "tile_scheduler")),
    ("grouped_operation", ("grouping", "dtype_a", "dtype_b", "dtype_d", "epilogue", "scaling")),
    ("grouped_epilogue", ("grouping", "epilogue_schedule")),
    ("blockwise_registers", ("scaling", "tile_n", "tile_m", "kernel_schedule")),
    ("smem_stages", _SMEM_READS),
    ("smem_capacity", _SMEM_READS),
))
"""Each rule `check_config` applies beside the per-value ones (`check_operands`, then
`check_combinations`), in its order, with the config fields it reads (a rule skipped after
another fired, as `accumulator_registers` after `cooperative_tile_m`, reads all that one reads).
The count of `kernels: auto` (space/_auto.py) decides a rule once these fields are set: keep the
two in step (tests/space/test_auto.py checks them against `check_config`)."""


def alignment_elements(dtype: DType) -> int:
    """Elements per 16-byte TMA access."""
    return TMA_ALIGNMENT_BYTES * 8 // dtype.bits


def check_problem(problem: Problem) -> list[Rejection]:
    """Reasons a problem cannot run on any kernel we build (shape, types, TMA alignment)."""
    out: list[Rejection] = []
    for dim in ("m", "n", "k"):
        v = getattr(problem, dim)
        if problem_dim_problem(v):
            out.append(Rejection("shape", f"{dim.upper()} must be a whole number from 1 to "
                                 f"{MAX_PROBLEM_DIM} (a 32-bit int in CUTLASS's problem shape), "
                                 f"not {v!r}"))
    if out:
        return out
    fp8 = _fp8_inputs(problem.dtype_a, problem.dtype_b)
    if not fp8 and (problem.dtype_a not in SUPPORTED_INPUTS or problem.dtype_b != problem.dtype_a):
        out.append(Rejection("dtype_inputs", "A and B must both be bf16, both f16, or both fp8 "
                             "(e4m3, e5m2)"))
    if problem.dtype_d not in SUPPORTED_OUTPUTS:
        out.append(Rejection("dtype_output", "D must be bf16, f16 or f32"))
    if fp8 and (problem.layout_a, problem.layout_b) != (Layout.ROW, Layout.COL):
        out.append(Rejection("fp8_layout", "fp8 inputs need layout tn: A row-major (M x K) and "
                             "B column-major (stored N x K)"))
    operation = operation_problem(problem.epilogue, problem.scaling)
    if operation:
        out.append(Rejection("operation", operation))
    elif problem.scaling is not Scaling.NONE and not fp8:
        out.append(Rejection("scaling_inputs", SCALING_INPUTS_REASON))
    elif problem.scaling is Scaling.BLOCKWISE and problem.grouped and problem.k % BLOCKWISE_K:
        # A grouped kernel reads A's scales K-major (a row's K/128 in a row): M is free.
        out.append(Rejection("blockwise_shape", f"block-wise scaling needs K a multiple of {BLOCKWISE_K} (whole "
                             f"1 x {BLOCKWISE_K} groups), not {problem.k}"))
    elif problem.scaling is Scaling.BLOCKWISE and not problem.grouped and (problem.k % BLOCKWISE_K
                                                                           or problem.m % 4):
        out.append(Rejection("blockwise_shape", f"block-wise scaling needs K a multiple of {BLOCKWISE_K} (whole "
                             f"1 x {BLOCKWISE_K} groups) and M of 4 (A's scales, M x K/{BLOCKWISE_K} "
                             f"with stride M, are loaded by TMA in 16 bytes): {problem.m} x {problem.k}"))
    out += _grouping_rejections(problem)
    if out:
        return out
    contiguous = (
        ("A", problem.dtype_a, "K" if problem.layout_a is Layout.ROW else "M"),
        ("B", problem.dtype_b, "K" if problem.layout_b is Layout.COL else "N"),
        ("D", problem.dtype_d, "N"),
    )
    for operand, dtype, dim in contiguous:
        align = alignment_elements(dtype)
        value = getattr(problem, dim.lower())
        if value % align:
            out.append(Rejection(
                "tma_alignment",
                f"{dim}={value} is not a multiple of {align}: TMA needs the contiguous dimension "
                f"of {operand} ({dtype.value}) aligned to {TMA_ALIGNMENT_BYTES} bytes",
            ))
    return out


def _grouping_rejections(problem: Problem) -> list[Rejection]:
    """A grouped problem's experts and routed rows, and no experts on a single GEMM."""
    if not isinstance(problem.grouping, Grouping):
        return [Rejection("operation", f"grouping must be one of {', '.join(g.value for g in Grouping)}, "
                          f"not {problem.grouping!r:.60}")]
    if problem.grouping is Grouping.NONE:
        if problem.groups or problem.group_rows:
            return [Rejection("groups", "experts and routed rows belong to a grouped problem only")]
        return []
    groups, rows = problem.groups, problem.group_rows
    if type(groups) is not int or not 1 <= groups <= MAX_GROUPS:
        return [Rejection("groups", f"a grouped problem needs 1 to {MAX_GROUPS} experts, not {groups!r:.40}")]
    if not isinstance(problem.routing, Routing):
        return [Rejection("groups", f"routing must be one of {', '.join(r.value for r in Routing)}, "
                          f"not {problem.routing!r:.40}")]
    if (not isinstance(rows, tuple) or len(rows) != groups
            or any(type(r) is not int or r < 0 for r in rows) or sum(rows) != problem.m):
        return [Rejection("groups", f"routed rows must be {groups} whole counts >= 0 (one per expert) "
                          f"summing to M={problem.m}")]
    out = []
    why = grouped_operation_problem(problem)
    if why:
        out.append(Rejection("grouped_operation", why))
    if problem.layout_a is not Layout.ROW:
        out.append(Rejection("grouped_layout", "a grouped GEMM's A is the routed rows, row-major (layout tn "
                             "or tt)"))
    return out


def check_pair(cfg: KernelConfig, problem: Problem) -> list[Rejection]:
    """Reasons `cfg` cannot compute `problem`: their operations differ."""
    mismatched = [f for f in Operation.FIELDS if getattr(cfg, f) != getattr(problem, f)]
    if mismatched:
        return [Rejection("problem_mismatch", f"kernel and problem differ in {', '.join(mismatched)}")]
    return []


def check_runtime(cfg: KernelConfig, args: RuntimeArgs) -> list[Rejection]:
    """Reasons `args` cannot be used with a kernel built from `cfg`."""
    out = [Rejection(field, problem) for knob in args.knobs for field, problem in knob.problems(args)]
    stream_k = cfg.tile_scheduler is TileScheduler.STREAM_K
    if not stream_k and (args.splits != 1 or args.decomposition is not Decomposition.HEURISTIC):
        out.append(Rejection("stream_k_args", "splits and decomposition apply to Stream-K kernels only"))
    if cfg.grouping is Grouping.GROUPED and args.swizzle != 1:
        out.append(Rejection("grouped_swizzle", "a grouped kernel launches one CTA per SM with no host problem "
                             "shapes, and CUTLASS's group scheduler then ignores max_swizzle_size: use swizzle 1"))
    if stream_k and args.splits > 1 and args.decomposition not in (
        Decomposition.SPLIT_K, Decomposition.HEURISTIC
    ):
        out.append(Rejection("stream_k_args", "splits > 1 needs the split_k or heuristic decomposition"))
    return out
