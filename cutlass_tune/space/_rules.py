"""Static validity rules: the one place that decides whether CUTLASS can build a config.

Every rule returns `Rejection`s with a stable rule id and a reason a person can act on. A config
with no rejection is expected to compile; the tests hold that claim against real nvcc. Where
CUTLASS would accept a value we have not verified, we reject it and say so: a rule that is too
strict costs a config, one that is too loose costs a 30-second compile and a confusing error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._epilogue import GLU_BLOCK, Activation, Epilogue, Pair, unrendered
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
from .cutlass import (
    BLOCKWISE_K,
    BLOCKWISE_SCALE_N,
    SMEM_CAPACITY_BYTES,
    accumulator_registers,
    fused,
    smem_usage,
)

if TYPE_CHECKING:  # _knobs declares each knob with its rule from here
    from ._knobs import KernelConfig, RuntimeArgs


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



def scale_n_problem(v: int) -> str | None:
    if not isinstance(v, int) or isinstance(v, bool) or v not in BLOCKWISE_SCALE_N:
        return "scale_n (B's block-wise scale granularity along N) must be 128, 64 or 32"
    return None


BLOCKWISE_SWAP_TILE_N = (16, 32, 64, 128)
"""The tile N (tokens, the caller's M) of an A/B-swapped block-wise kernel: the widths nvcc built
here without spills (tests/compile/test_nvcc_blockwise_swap.py)."""



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
    operation = operation_problem(cfg.epilogue, cfg.scaling, cfg.grouping)
    if operation:
        reject("operation", operation)
    elif cfg.scaling is not Scaling.NONE and not _fp8_inputs(cfg.dtype_a, cfg.dtype_b):
        reject("scaling_inputs", SCALING_INPUTS_REASON)
    return out


SCALING_INPUTS_REASON = ("fp8 scales (scaling tensor, rowcol or blockwise) apply to fp8 inputs (e4m3, e5m2) "
                         "only; a 16-bit GEMM scales by alpha")


def operation_problem(epilogue: object, scaling: object, grouping: object = Grouping.NONE) -> str | None:
    """Whether an epilogue and a scaling are values of their types (they reach the C++), and, but
    for a grouped GEMM (`grouped_operation_problem` says what its kernels render), whether a
    single GEMM's kernel renders the epilogue's nodes."""
    if not (isinstance(epilogue, Epilogue) and type(epilogue.bias) is bool and type(epilogue.residual) is bool
            and type(epilogue.gated) is bool and isinstance(epilogue.activation, Activation)
            and isinstance(epilogue.pair, Pair) and type(epilogue.row_scale) is bool):
        return (f"epilogue must be an Epilogue of bias, activation, residual, gated, pair and row_scale, "
                f"not {epilogue!r:.60}")
    why = epilogue.problem()
    if why:
        return f"epilogue: {why}"
    missing = () if grouping is Grouping.GROUPED else unrendered(epilogue.tree(), Grouping.NONE)
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
    glu = cfg.epilogue.pair is not Pair.NONE  # its own no-smem collective (`_grouped_rejections`)
    if not cfg.epilogue_source and not tma_epilogue and not glu:
        reject("epilogue_source", "a kernel without a C operand is built here with the TMA "
               "epilogues only (no_smem without C is not verified)")
    if cfg.epilogue.residual and not cfg.epilogue_source:
        reject("residual_source", "a residual epilogue reads C: it needs epilogue_source true")
    if cfg.epilogue.gated and not cfg.epilogue_source:
        reject("residual_source", "a gated epilogue reads the gate from C: it needs epilogue_source true")
    if cfg.scaling is Scaling.BLOCKWISE and not fused(cfg) and not tma_epilogue:
        reject("fusion_schedule", "block-wise kernels are built with the TMA epilogues only (the no_smem "
               "epilogue after the block-wise mainloop is not verified): use tma or tma_cooperative")
    elif fused(cfg) and not tma_epilogue and not glu:
        reject("fusion_schedule", f"the {cfg.epilogue.name} epilogue"
               + (f" with {cfg.scaling.value} scaling" if cfg.scaling is not Scaling.NONE else "")
               + " is a fusion CUTLASS builds on the TMA epilogues only (no_smem takes a plain "
               "linear combination): use tma or tma_cooperative")

    if cfg.grouped:
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
    grouped kernel renders (`NODES`: an activation, through the ptr-array LinCombEltAct, or a GLU
    pair interleaved in blocks of `GLU_BLOCK`), on 16-bit inputs; the fp8 one takes the plain
    epilogue."""
    missing = unrendered(op.epilogue.tree(), Grouping.GROUPED)
    if missing:
        return (f"a grouped GEMM's epilogue takes an activation or a GLU pair at most: its "
                f"{', '.join(k.value for k in missing)} node is not built for grouped kernels")
    if op.epilogue.pair is Pair.SPLIT:
        return (f"a grouped GLU kernel reads gate and up interleaved in blocks of {GLU_BLOCK} (pair "
                f"{Pair.INTERLEAVED.value}): lay the weights out once with runtime.interleave_gate_up")
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
    k_grouped = cfg.grouping is Grouping.GROUPED_K
    why = grouped_k_operation_problem(cfg) if k_grouped else grouped_operation_problem(cfg)
    if why:
        out.append(Rejection("grouped_operation", why))
    if k_grouped and cfg.epilogue_source:
        out.append(Rejection("grouped_epilogue", "a weight-gradient kernel writes dW = G^T X whole: no C "
                             "(epilogue_source false)"))
    # A GLU tile holds whole gate/up pairs: tile N is a multiple of 16 = 2 * GLU_BLOCK already.
    if cfg.epilogue.pair is not Pair.NONE:
        if cfg.epilogue_schedule is not EpilogueSchedule.NO_SMEM or cfg.epilogue_source:
            out.append(Rejection("grouped_epilogue", "a grouped GLU kernel stores D from the registers "
                                 "(epilogue no_smem) and reads no C (epilogue_source false)"))
    elif cfg.epilogue_schedule is EpilogueSchedule.NO_SMEM:
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
    ("epilogue_source", ("epilogue_source", "epilogue_schedule", "epilogue")),
    ("residual_source", ("epilogue", "epilogue_source")),
    ("fusion_schedule", ("epilogue", "scaling", "epilogue_schedule")),
    ("grouped_schedule", ("grouping", "kernel_schedule", "tile_scheduler")),
    ("grouped_operation", ("grouping", "dtype_a", "dtype_b", "dtype_d", "layout_a", "layout_b", "epilogue",
                           "scaling")),
    ("grouped_epilogue", ("grouping", "epilogue_schedule", "epilogue", "epilogue_source")),
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
    operation = operation_problem(problem.epilogue, problem.scaling, problem.grouping)
    if operation:
        out.append(Rejection("operation", operation))
    elif problem.epilogue.pair is not Pair.NONE and problem.n % (2 * GLU_BLOCK):
        out.append(Rejection("glu_shape", f"a GLU pair needs N a multiple of {2 * GLU_BLOCK} (blocks of "
                             f"{GLU_BLOCK} gate and {GLU_BLOCK} up columns), not {problem.n}"))
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
    ) if problem.grouping is not Grouping.GROUPED_K else _grouped_k_contiguous(problem)
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
    if problem.grouping is Grouping.GROUPED_K:
        why = grouped_k_operation_problem(problem)
        return [Rejection("grouped_operation", why)] if why else []
    out = []
    why = grouped_operation_problem(problem)
    if why:
        out.append(Rejection("grouped_operation", why))
    if problem.layout_a is not Layout.ROW:
        out.append(Rejection("grouped_layout", "a grouped GEMM's A is the routed rows, row-major (layout tn "
                             "or tt)"))
    return out


def _grouped_k_contiguous(problem: Problem) -> tuple[tuple[str, DType, str], ...]:
    """A weight gradient's contiguous dimensions, each a whole number of 16-byte TMA accesses so
    that every expert's first row is aligned too: G's rows (N), X's rows (K), dW's rows (K).
    The routed rows (M) run along the strides and may be any count."""
    return (("G", problem.dtype_a, "N"), ("X", problem.dtype_b, "K"), ("D", problem.dtype_d, "K"))


def grouped_k_operation_problem(op: Operation) -> str | None:
    """Why the weight-gradient kernel (`Grouping.GROUPED_K`) does not compute `op`, or None. It
    takes 16-bit G and X of one type and gives dW of the same, the plain product (no epilogue,
    no scales), layout nt: each group's A is G_e^T (N x M_e, M-major) and its B is X_e (M_e x K,
    N-major), row blocks of row-major tensors, the transposed loads TMA and wgmma take for 16-bit
    types (fp8 wgmma reads K-major operands only, and here K is the routed rows)."""
    if (op.dtype_a not in SUPPORTED_INPUTS or op.dtype_a.is_fp8 or op.dtype_b is not op.dtype_a
            or op.dtype_d is not op.dtype_a or op.scaling is not Scaling.NONE):
        return ("a weight-gradient grouped GEMM takes bf16 or f16 G and X and gives dW of the same type, "
                "unscaled (fp8 wgmma reads K-major operands only)")
    if not op.epilogue.is_plain:
        return f"a weight-gradient grouped GEMM takes the plain epilogue, not {op.epilogue.name}"
    if (op.layout_a, op.layout_b) != (Layout.COL, Layout.ROW):
        return ("a weight-gradient grouped GEMM has layout nt: each expert's A is G_e^T (N x M_e, M-major) "
                f"and its B is X_e (M_e x K, N-major), row blocks of row-major tensors; not {op.layout}")
    return None


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
    if cfg.grouped and args.swizzle != 1:
        out.append(Rejection("grouped_swizzle", "a grouped kernel launches one CTA per SM with no host problem "
                             "shapes, and CUTLASS's group scheduler then ignores max_swizzle_size: use swizzle 1"))
    if stream_k and args.splits > 1 and args.decomposition not in (
        Decomposition.SPLIT_K, Decomposition.HEURISTIC
    ):
        out.append(Rejection("stream_k_args", "splits > 1 needs the split_k or heuristic decomposition"))
    return out
