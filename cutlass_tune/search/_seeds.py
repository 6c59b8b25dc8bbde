"""Warm-start configs: CUTLASS's common choices, then the best of the nearest tuned problems."""

from __future__ import annotations

import math

from ..space import EpilogueSchedule, KernelConfig, KernelSchedule, Problem, SearchSpace, TileScheduler
from ..status import Status
from ..store import ResultStore

# Configs CUTLASS's own examples and profiler defaults favour on SM90 for 16-bit GEMMs,
# and the reference probes' best per size.
COMMON_DEFAULTS = (
    dict(tile_m=128, tile_n=256, tile_k=64, cluster_m=2, cluster_n=1),
    dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1),
    dict(tile_m=128, tile_n=256, tile_k=64, cluster_m=1, cluster_n=2),
    dict(tile_m=128, tile_n=128, tile_k=64, cluster_m=2, cluster_n=1,
         kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA),
    dict(tile_m=64, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1,
         kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA),
    dict(tile_m=128, tile_n=64, tile_k=64, cluster_m=1, cluster_n=1),
    dict(tile_m=128, tile_n=256, tile_k=64, cluster_m=2, cluster_n=1, tile_scheduler=TileScheduler.STREAM_K),
    dict(tile_m=256, tile_n=128, tile_k=64, cluster_m=2, cluster_n=1),
)
NEAREST_PROBLEMS = 3


def _log_distance(a: Problem, b: Problem) -> float:
    return math.dist((math.log2(a.m), math.log2(a.n), math.log2(a.k)),
                     (math.log2(b.m), math.log2(b.n), math.log2(b.k)))


def seed_configs(space: SearchSpace, store: ResultStore, problems: list[Problem]) -> list[KernelConfig]:
    """Configs to enqueue before sampling, in order, each valid and in `space`."""
    members = {c.hash: c for c in space.candidates}
    out: dict[str, KernelConfig] = {}
    for p in problems:
        for knobs in COMMON_DEFAULTS:
            cfg = KernelConfig(dtype_a=p.dtype_a, dtype_b=p.dtype_b, dtype_c=p.dtype_d, dtype_d=p.dtype_d,
                               layout_a=p.layout_a, layout_b=p.layout_b, **knobs)
            if cfg.hash in members:
                out.setdefault(cfg.hash, cfg)
    # The best config of each stored problem nearest to ours (same types and layouts).
    best: dict[Problem, tuple[float, KernelConfig]] = {}
    for m in store.measurements():
        if m.status is Status.OK and m.config is not None and m.tflops and m.config.hash in members:
            if m.problem not in best or m.tflops > best[m.problem][0]:
                best[m.problem] = (m.tflops, m.config)
    for p in problems:
        nearest = sorted((q for q in best if q != p and (q.dtype_a, q.layout_a, q.layout_b) ==
                          (p.dtype_a, p.layout_a, p.layout_b)), key=lambda q: _log_distance(p, q))
        for q in nearest[:NEAREST_PROBLEMS]:
            out.setdefault(best[q][1].hash, best[q][1])
    return list(out.values())
