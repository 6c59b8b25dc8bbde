"""Warm-start configs: CUTLASS's common choices, a tile that fills the GPU's waves for each
problem the common choices fit badly, the best of the nearest tuned problems, and, when the
optional `nvidia-matmul-heuristics` package is installed, its top-k for each problem."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Callable

from ..space import (
    PAIRED_EPILOGUE,
    Activation,
    DType,
    Grouping,
    Inputs,
    KernelConfig,
    KernelSchedule,
    KindRegistry,
    Layout,
    OperationKind,
    Problem,
    SearchSpace,
    TileScheduler,
)
from ..status import Status
from ..store import ResultStore

_PINGPONG = dict(kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=PAIRED_EPILOGUE[KernelSchedule.PINGPONG])
_PLAIN = dict(kernel_schedule=KernelSchedule.TMA_WS, epilogue_schedule=PAIRED_EPILOGUE[KernelSchedule.TMA_WS])

# 16-bit GEMM configs that won somewhere on an H200 against a paired cuBLAS baseline
# (benchmarks/beat_cublas.md), best first: ping-pong 128x128 and 128x192 from 4096^3 up,
# the plain (not persistent) 64x128 and 128x64 for about 1024^3 and 64x64 below it (it won
# 128^3-512^3 on both an H200 and an H100, where sweeps found it only after 17-43 configs), the
# cooperative 128x256 / 256x128 that CUTLASS's profiler favours, and Stream-K for shapes whose
# tile count leaves a wave part-empty.
COMMON_DEFAULTS = (
    dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=2, **_PINGPONG),
    dict(tile_m=128, tile_n=192, tile_k=64, cluster_m=2, cluster_n=1, **_PINGPONG),
    dict(tile_m=64, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, **_PLAIN),
    dict(tile_m=128, tile_n=64, tile_k=64, cluster_m=1, cluster_n=1, **_PLAIN),
    dict(tile_m=64, tile_n=64, tile_k=64, cluster_m=1, cluster_n=1, **_PLAIN),
    dict(tile_m=128, tile_n=256, tile_k=64, cluster_m=1, cluster_n=2),
    dict(tile_m=256, tile_n=128, tile_k=64, cluster_m=1, cluster_n=2),
    dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, **_PINGPONG),
    dict(tile_m=128, tile_n=256, tile_k=64, cluster_m=2, cluster_n=1, tile_scheduler=TileScheduler.STREAM_K),
    dict(tile_m=64, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, **_PINGPONG),
)
_COOPERATIVE = dict(kernel_schedule=KernelSchedule.COOPERATIVE,
                    epilogue_schedule=PAIRED_EPILOGUE[KernelSchedule.COOPERATIVE])
# Grouped (MoE experts) configs picked by hand that ran fastest on an H200 against
# torch._grouped_mm, best first. They, not the plain GEMM's defaults, lead a grouped problem
# before it has results (the grouped prior, fitted on the committed grouped rows, comes after
# them: 24 problems of one GPU model are too few to trust first); 2x1 clusters were among the
# slowest for the fine-grained experts (a few hundred rows each) and are left out.
GROUPED_DEFAULTS = (
    dict(tile_m=128, tile_n=256, tile_k=64, cluster_m=1, cluster_n=1, **_COOPERATIVE),
    dict(tile_m=128, tile_n=192, tile_k=64, cluster_m=1, cluster_n=1, **_PINGPONG),
    dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, **_COOPERATIVE),
    dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, **_PINGPONG),
    dict(tile_m=256, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, **_COOPERATIVE),
)
# Block-wise fp8 grouped (fp8 MoE experts) configs picked by hand, not yet measured: the two tiles
# CUTLASS 4.2's ptr-array FP8Blockwise mainloop builds without spills (space/_rules.py), cluster
# 1x1 first as for the fine-grained bf16 experts, then the multicast clusters for coarse ones.
GROUPED_BLOCKWISE_DEFAULTS = (
    dict(tile_m=128, tile_n=128, tile_k=128, cluster_m=1, cluster_n=1, **_COOPERATIVE),
    dict(tile_m=64, tile_n=128, tile_k=128, cluster_m=1, cluster_n=1, **_PINGPONG),
    dict(tile_m=128, tile_n=128, tile_k=128, cluster_m=2, cluster_n=1, **_COOPERATIVE),
    dict(tile_m=64, tile_n=128, tile_k=128, cluster_m=2, cluster_n=1, **_PINGPONG),
    dict(tile_m=128, tile_n=128, tile_k=128, cluster_m=1, cluster_n=2, **_COOPERATIVE),
)
# Weight-gradient (K-grouped) configs picked by hand, not yet measured: each expert's dW_e is one
# N x K output reduced over its routed rows (thousands in a training step), the shape of a large
# dense GEMM, so the forward's wide tiles lead; cluster 1x1 first, then 2x1 (multicast of X).
GROUPED_K_DEFAULTS = (
    dict(tile_m=128, tile_n=256, tile_k=64, cluster_m=1, cluster_n=1, **_COOPERATIVE),
    dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, **_COOPERATIVE),
    dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, **_PINGPONG),
    dict(tile_m=256, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, **_COOPERATIVE),
    dict(tile_m=128, tile_n=256, tile_k=64, cluster_m=2, cluster_n=1, **_COOPERATIVE),
)
# fp8 (e4m3/e5m2) configs picked by hand from public figures, best first: vLLM's CUTLASS 3.x
# row-wise kernels on an H100 (ping-pong FP8FastAccum 128x128x128 with a 2x1 cluster at about
# 0.98 of torch._scaled_mm at 4096^3; 64x128x128 ping-pong for M up to 128; cooperative
# 128x128 and 128x256 with fast accumulation), then the promoting (exact fp32) 128x128. K tile
# 128: 128 bytes of fp8 per row, as the 16-bit kernels' 64. They, not the 16-bit defaults with
# fp8's K, lead an fp8 problem before it has results: no fp8 measurement was committed.
FP8_DEFAULTS = (
    dict(tile_m=128, tile_n=128, tile_k=128, cluster_m=2, cluster_n=1, fp8_fast_accum=True, **_PINGPONG),
    dict(tile_m=128, tile_n=128, tile_k=128, cluster_m=1, cluster_n=2, fp8_fast_accum=True, **_COOPERATIVE),
    dict(tile_m=128, tile_n=256, tile_k=128, cluster_m=2, cluster_n=1, fp8_fast_accum=True, **_COOPERATIVE),
    dict(tile_m=64, tile_n=128, tile_k=128, cluster_m=2, cluster_n=1, fp8_fast_accum=True, **_PINGPONG),
    dict(tile_m=128, tile_n=128, tile_k=128, cluster_m=2, cluster_n=1, fp8_fast_accum=False, **_COOPERATIVE),
)
# For M up to FP8_SMALL_M, vLLM's swapped kernels first: the kernel computes D^T = B^T A^T, so
# the few rows of A fill a 16- or 64-wide tile N instead of a 64-row tile M (tile M runs over
# N). Row-wise scaled problems only (`swap_ab`'s rule); others skip them.
FP8_SMALL_M = 64
FP8_SMALL_M_DEFAULTS = (
    dict(tile_m=64, tile_n=16, tile_k=256, cluster_m=1, cluster_n=1, fp8_fast_accum=True, swap_ab=True, **_PINGPONG),
    dict(tile_m=64, tile_n=64, tile_k=256, cluster_m=1, cluster_n=1, fp8_fast_accum=True, swap_ab=True, **_PINGPONG),
    dict(tile_m=64, tile_n=16, tile_k=256, cluster_m=1, cluster_n=2, fp8_fast_accum=True, swap_ab=True, **_PINGPONG),
    dict(tile_m=64, tile_n=64, tile_k=256, cluster_m=1, cluster_n=2, fp8_fast_accum=True, swap_ab=True, **_PINGPONG),
)
# 16-bit problems whose epilogue applies an activation: ping-pong 128x128 first. It led all 24
# problems of the epilogue-gap sweep on an H200 (bias+relu, bias+gelu_tanh and bias+gelu on
# eight LLM MLP shapes, K 1024-6144), 6-10% ahead of cooperative 128x256: one warp group's
# epilogue, the activation included, runs under the other's mainloop (benchmarks/epilogue_gap.md).
FUSED_DEFAULTS = (
    dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, **_PINGPONG),
)
NEAREST_PROBLEMS = 3
WAVE_FIT_MARGIN = 0.05
"""How much better a tile must fill the last wave than every large common default's tile before
it joins the seeds (on the squares and the Llama shapes measured, the defaults fill 96-97%)."""
WAVE_FIT_MIN_AREA = 128 * 128
"""Wave fill is compared among tiles of at least this area. Smaller tiles fill the waves of a
large problem evenly but load each operand byte for fewer flops: none won a problem from 2048^3
up, and a 64x128 default filling 97% of the waves of LLaMA-33B's 6656-wide GEMMs hid the
128x208 tile that matched or beat every default there (benchmarks/beat_cublas.md)."""
WAVE_FIT_MIN_FILL = 0.90
"""A tile that leaves more of its last wave idle is no fit (large tiles on small problems)."""
HEURISTIC_TOP_K = 4
_HEURISTICS_GPU = (("H200", "H200_SXM"), ("H100 PCIe", "H100_PCIE"), ("H100 NVL", "H100_NVL"),
                   ("H100", "H100_SXM"), ("H20", "H20_SXM"))
_PRECISION = {DType.BF16: "T", DType.F16: "H", DType.F32: "S"}
log = logging.getLogger(__name__)


def heuristic_configs(problem: Problem, gpu_name: str | None, count: int = HEURISTIC_TOP_K) -> list[KernelConfig]:
    """nvMatmulHeuristics' top `count` tile/cluster/stage choices for `problem`, as configs
    (cooperative where tile M allows, else ping-pong; the model does not rank schedules).
    Empty when the package is missing or fails, and for a grouped problem (its model is of
    one GEMM)."""
    if problem.grouped:
        return []
    try:
        import nvMatmulHeuristics as nvmmh
    except ImportError:
        return []
    try:
        gpu = next((v for k, v in _HEURISTICS_GPU if gpu_name and k in gpu_name), None)
        target = nvmmh.NvMatmulHeuristicsTarget["CUTLASS3"]
        lib = nvmmh.NvMatmulHeuristicsInterfaceEx(
            backend=target, flags=nvmmh.NvMatmulHeuristicsFlags.PERF_MODEL_BASED_AUTO_TUNING,
            load_discovery_implicitly=True, gpu=nvmmh.NvMatmulHeuristicsNvidiaGpu[gpu] if gpu else None)
        backend = lib.createBackend(target)
        layout = ("T" if problem.layout_a is Layout.ROW else "N") + ("T" if problem.layout_b is Layout.ROW else "N")
        query = lib.makeNvMatmulHeuristicsProblem(
            problem.m, problem.n, problem.k, nvmmh.NvMatmulHeuristicsMatmulLayout[f"{layout}_ROW_MAJOR"], 1)
        precision = _PRECISION[problem.dtype_a] + "S" + _PRECISION[problem.dtype_d]
        found = lib.getEx(query, count, backend, precision=precision)
    except Exception as err:  # an optional advisor must never stop a sweep
        log.warning("nvMatmulHeuristics gave no seeds for %s: %s", problem.name, err)
        return []
    out = []
    for entry in found:
        k = entry["kernel"]
        schedule = KernelSchedule.COOPERATIVE if k.cta_tile_m % 128 == 0 else KernelSchedule.PINGPONG
        cfg = KernelConfig.for_operation(
            problem, tile_m=int(k.cta_tile_m),
            tile_n=int(k.cta_tile_n), tile_k=int(k.cta_tile_k), cluster_m=int(k.cluster_m),
            cluster_n=int(k.cluster_n), stages=int(getattr(k, "stages", 0) or 0), kernel_schedule=schedule,
            epilogue_schedule=PAIRED_EPILOGUE[schedule])
        out.append(cfg)
        out.append(dataclasses.replace(cfg, stages=0))  # the same tile with CUTLASS's auto stages
    return out


def wave_fill(cfg: KernelConfig, problem: Problem, sm_count: int) -> float:
    """Share of the SM time a persistent data-parallel kernel spends on useful tile area: the
    problem's area over whole waves of tiles (a ping-pong SM works on two tiles at once, at half
    speed each). 1.0 when the tiles divide the problem and fill every wave."""
    rows, cols = (problem.n, problem.m) if cfg.swap_ab else (problem.m, problem.n)  # the kernel's problem
    tiles = math.ceil(rows / cfg.tile_m) * math.ceil(cols / cfg.tile_n)
    slots = sm_count * (2 if cfg.kernel_schedule is KernelSchedule.PINGPONG else 1)
    return rows * cols / (math.ceil(tiles / slots) * slots * cfg.tile_m * cfg.tile_n)


def _persistent(cfg: KernelConfig) -> bool:
    """Persistent and data-parallel: one CTA per SM walks the tiles (the plain kernel launches a
    CTA per tile, several per SM; Stream-K splits K)."""
    return cfg.kernel_schedule is not KernelSchedule.TMA_WS and cfg.tile_scheduler is TileScheduler.PERSISTENT


def wave_fit_configs(members: list[KernelConfig], problems: list[Problem], sm_count: int,
                     defaults: list[KernelConfig]) -> list[KernelConfig]:
    """For each problem whose large common defaults fill the waves less well than some large
    persistent tile of the space (by WAVE_FIT_MARGIN, and at least WAVE_FIT_MIN_FILL), the best
    filling tile of each schedule, cooperative and ping-pong (they split the SM differently, and
    each won shapes the other lost): the largest among the best filling, data-parallel, the
    smallest cluster, as few other knobs as the space allows. Stream-K is left out of the
    comparison: it fills waves by splitting K, at a cost the sampler measures."""
    def large(c: KernelConfig) -> bool:
        return _persistent(c) and c.tile_m * c.tile_n >= WAVE_FIT_MIN_AREA

    out = []
    ours = [c for c in defaults if large(c)]
    theirs = [c for c in members if large(c)]
    for p in problems:
        floor = max((wave_fill(c, p, sm_count) for c in ours), default=0.0) + WAVE_FIT_MARGIN

        def rank(c: KernelConfig, p: Problem = p) -> tuple:
            return (round(wave_fill(c, p, sm_count), 2), c.tile_m * c.tile_n, -c.cluster_m * c.cluster_n,
                    not c.epilogue_source, c.stages == 0, c.epilogue_tile_n == 0, -c.tile_k)
        for schedule in (KernelSchedule.COOPERATIVE, KernelSchedule.PINGPONG):
            same = [c for c in theirs if c.operation == p.operation and c.kernel_schedule is schedule]
            if same and wave_fill(best := max(same, key=rank), p, sm_count) >= max(floor, WAVE_FIT_MIN_FILL):
                out.append(best)
    return out


def _log_distance(a: Problem, b: Problem) -> float:
    return math.dist((math.log2(a.m), math.log2(a.n), math.log2(a.k)),
                     (math.log2(b.m), math.log2(b.n), math.log2(b.k)))


def _wave_fit_pool(space: SearchSpace) -> list[KernelConfig]:
    """The configs wave fitting picks from: the valid ones of a space of knob lists; of
    `kernels: auto`, each tile of each kind's persistent schedules with the other knobs at
    their defaults (the walk's 190,240 are not listed for this)."""
    if not space.auto:
        return list(space.valid)
    out = []
    for kind in space.auto:
        tiles = {k.name: values for k, values in kind.knobs}
        for tile_m, tile_n, schedule, source in itertools.product(
                tiles["tile_m"], tiles["tile_n"], (KernelSchedule.COOPERATIVE, KernelSchedule.PINGPONG), (False, True)):
            cfg = KernelConfig.for_operation(kind.operation, tile_m=tile_m, tile_n=tile_n, kernel_schedule=schedule,
                                             epilogue_schedule=PAIRED_EPILOGUE[schedule], epilogue_source=source)
            if cfg in kind:
                out.append(cfg)
    return out


def default_knobs(problem: Problem) -> tuple[dict, ...]:
    """The hand-picked knobs that lead `problem`, best first: `GROUPED_DEFAULTS` for a grouped
    problem (`GROUPED_BLOCKWISE_DEFAULTS` for a block-wise fp8 one); for fp8,
    `FP8_SMALL_M_DEFAULTS` (M up to `FP8_SMALL_M`) then `FP8_DEFAULTS`; `FUSED_DEFAULTS` then
    `COMMON_DEFAULTS` for a 16-bit one with an activation; `COMMON_DEFAULTS` for the others.
    Each kind's are `DEFAULT_KNOBS`'."""
    return DEFAULT_KNOBS[problem.kind](problem)


def _fp8_knobs(problem: Problem) -> tuple[dict, ...]:
    return (FP8_SMALL_M_DEFAULTS if problem.m <= FP8_SMALL_M else ()) + FP8_DEFAULTS


def _wide_knobs(problem: Problem) -> tuple[dict, ...]:
    if problem.epilogue.activation is not Activation.NONE:
        return FUSED_DEFAULTS + COMMON_DEFAULTS
    return COMMON_DEFAULTS


DEFAULT_KNOBS: KindRegistry[Callable[[Problem], tuple[dict, ...]]] = KindRegistry("hand-picked seeds")
"""The hand-picked knobs that lead each kind's problems (`default_knobs`)."""
DEFAULT_KNOBS.add(_wide_knobs)
DEFAULT_KNOBS.add(_fp8_knobs, grouping=Grouping.NONE, inputs=Inputs.FP8)
DEFAULT_KNOBS.add(_fp8_knobs, grouping=Grouping.NONE, inputs=Inputs.FP8_BLOCKWISE)
DEFAULT_KNOBS.add(lambda problem: GROUPED_DEFAULTS, grouping=Grouping.GROUPED)
DEFAULT_KNOBS.add(lambda problem: GROUPED_BLOCKWISE_DEFAULTS, grouping=Grouping.GROUPED,
                  inputs=Inputs.FP8_BLOCKWISE)
DEFAULT_KNOBS.add(lambda problem: GROUPED_K_DEFAULTS, grouping=Grouping.GROUPED_K)


def fused_defaults(problem: Problem, space: SearchSpace) -> list[KernelConfig]:
    """`FUSED_DEFAULTS` of `problem`'s operation that `space` holds, in order, for a 16-bit
    single GEMM with an activation in its epilogue; empty for any other problem."""
    activated = problem.epilogue.activation is not Activation.NONE
    return _held(FUSED_DEFAULTS, problem, space) if activated and problem.kind == OperationKind() else []


def grouped_defaults(problem: Problem, space: SearchSpace) -> list[KernelConfig]:
    """The grouped defaults of `problem`'s operation (`default_knobs`) that `space` holds, in
    order (each without a C operand where the space has that variant, as `seed_configs` takes
    them)."""
    return _held(default_knobs(problem), problem, space)


def fp8_defaults(problem: Problem, space: SearchSpace) -> list[KernelConfig]:
    """The fp8 defaults of `problem` (`default_knobs`) that `space` holds, in order (each
    without a C operand where the space has that variant); empty for a 16-bit problem."""
    return _held(default_knobs(problem), problem, space) if problem.dtype_a.is_fp8 else []


def _held(defaults: tuple[dict, ...], problem: Problem, space: SearchSpace) -> list[KernelConfig]:
    out = []
    for knobs in defaults:
        for source in (False, True):
            cfg = KernelConfig.for_operation(problem, epilogue_source=source, **knobs)
            if space.holds(cfg):
                out.append(cfg)
                break
    return out


def seed_configs(space: SearchSpace, store: ResultStore, problems: list[Problem],
                 gpu_name: str | None = None, sm_count: int | None = None) -> list[KernelConfig]:
    """Configs to enqueue before sampling, in order, each valid and in `space`. Without
    `sm_count` (the GPU's SMs) no wave-fitting tiles are added. A grouped or fp8 problem's
    defaults are its own (`default_knobs`)."""
    out: dict[str, KernelConfig] = {}
    # The performance model's picks first, one problem at a time, so each problem gets its own.
    picks = [heuristic_configs(p, gpu_name) for p in problems]
    for rank in range(max((len(x) for x in picks), default=0)):
        for found in picks:
            if rank < len(found) and space.holds(found[rank]):
                out.setdefault(found[rank].hash, found[rank])
    defaults: list[KernelConfig] = []
    for p in problems:
        for knobs in default_knobs(p):
            # Without a C operand where the space has it: every launch here has beta = 0, and
            # the sourceless epilogue measured as fast or faster (benchmarks/beat_cublas.md).
            for source in (False, True):
                cfg = KernelConfig.for_operation(p, epilogue_source=source, **knobs)
                if space.holds(cfg):
                    out.setdefault(cfg.hash, cfg)
                    defaults.append(cfg)
                    break
    if sm_count:
        for cfg in wave_fit_configs(_wave_fit_pool(space), problems, sm_count, defaults):
            out.setdefault(cfg.hash, cfg)
    # The best config of each stored problem nearest to ours (of the same operation).
    best: dict[Problem, tuple[float, KernelConfig]] = {}
    for m in store.measurements():
        if m.status is Status.OK and m.config is not None and m.tflops and space.holds(m.config):
            if m.problem not in best or m.tflops > best[m.problem][0]:
                best[m.problem] = (m.tflops, m.config)
    for p in problems:
        nearest = sorted((q for q in best if q != p and q.operation == p.operation),
                         key=lambda q: _log_distance(p, q))
        for q in nearest[:NEAREST_PROBLEMS]:
            out.setdefault(best[q][1].hash, best[q][1])
    return list(out.values())
