"""What the prior sees of a config on a problem: its knobs as what CUTLASS makes of them
(`config_columns`, and `auto_columns` for the valid configs of a `kernels: auto` kind, built
without a config per row) and `FEATURES`, computed for many configs at once with numpy
(`features`). `Pool` holds the configs one ranking runs over.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..space import AutoKernels, KernelConfig, KernelSchedule, Layout, Problem, TileScheduler, smem_usage
from ..space.cutlass import WGMMA_N_DEFAULT, epilogue_tile

SMEM_PER_SM = 233472
"""Shared memory of one SM (228 KiB), which the plain kernel's CTAs share."""

FEATURES = (
    "log2_m", "log2_n", "log2_k", "in_bits", "out_bits", "a_k_major", "b_k_major",
    "tile_m", "tile_n", "tile_k", "log2_tile_area", "cluster_m", "cluster_n", "cluster_ctas",
    "cooperative", "pingpong", "plain", "stream_k", "no_smem", "sourceless", "epilogue_tile_n", "epilogue_auto",
    "stages", "stages_auto", "pipeline_kib", "fast_accum", "accumulators", "extended_wgmma",
    "tiles_m", "tiles_n", "log2_tiles", "slots", "waves", "wave_fill", "tail_fill", "stream_k_fill", "best_fill",
    "pad_m", "pad_n", "pad", "cluster_pad", "intensity", "intensity_multicast", "k_iters", "k_pad",
    "log2_work_per_slot", "useful_share",
)
"""What the model sees of a (problem, config) pair; `features` computes them."""


# ---- configs as columns ----------------------------------------------------------------------
_SCHEDULES = (KernelSchedule.COOPERATIVE, KernelSchedule.PINGPONG, KernelSchedule.TMA_WS)


@dataclasses.dataclass(frozen=True)
class _Resolved:
    """What a config's knobs come to in CUTLASS: stage count and bytes, epilogue subtile."""

    stages: int
    pipeline_bytes: int
    total_bytes: int
    epilogue_n: int


def _resolve(cfg: KernelConfig, cache: dict[tuple, _Resolved]) -> _Resolved:
    key = (cfg.dtype_a, cfg.dtype_c, cfg.dtype_d, cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.stages,
           cfg.kernel_schedule, cfg.epilogue_schedule, cfg.epilogue_tile_n, cfg.epilogue_source, cfg.epilogue,
           cfg.scaling)  # a fused epilogue's bias and scale rows take shared memory
    found = cache.get(key)
    if found is None:
        usage = smem_usage(cfg)
        found = cache[key] = _Resolved(usage.stages, usage.stages * usage.stage_bytes, usage.total_bytes,
                                       epilogue_tile(cfg)[1])
    return found


_COLUMNS = ("tile_m", "tile_n", "tile_k", "cluster_m", "cluster_n", "stages", "stages_auto", "schedule",
            "stream_k", "no_smem", "sourceless", "epilogue_n", "epilogue_auto", "pipeline_bytes", "total_bytes",
            "fast_accum", "in_bits", "out_bits", "swap_ab")


def config_columns(configs: Iterable[KernelConfig]) -> dict[str, np.ndarray]:
    """The knobs of `configs` as what CUTLASS makes of them, one array per column, a row per config."""
    cache: dict[tuple, _Resolved] = {}
    rows = []
    for c in configs:
        r = _resolve(c, cache)
        rows.append((c.tile_m, c.tile_n, c.tile_k, c.cluster_m, c.cluster_n, r.stages, c.stages == 0,
                     _SCHEDULES.index(c.kernel_schedule), c.tile_scheduler is TileScheduler.STREAM_K,
                     c.epilogue_schedule.value == "no_smem", not c.epilogue_source, r.epilogue_n,
                     c.epilogue_tile_n == 0, r.pipeline_bytes, r.total_bytes, c.fp8_fast_accum,
                     c.dtype_a.bits, c.dtype_d.bits, c.swap_ab))
    table = np.array(rows, dtype=np.float64).reshape(-1, len(_COLUMNS))
    return {name: table[:, i] for i, name in enumerate(_COLUMNS)}


def auto_columns(auto: AutoKernels) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every valid config of `auto` as `config_columns`, without building a config per row
    (one per distinct combination of the knobs CUTLASS resolves), and the value indices of
    each (`AutoKernels.config_of` builds one back)."""
    chosen = _value_indices(auto)
    values = {knob.name: (d, vals) for d, (knob, vals) in enumerate(auto.knobs)}

    def pick(name: str, part: int | None = None) -> np.ndarray:
        d, vals = values[name]
        table = np.array([v if part is None else v[part] for v in vals], dtype=object)
        return table[chosen[:, d]]

    out: dict[str, np.ndarray] = {}
    for name in ("tile_m", "tile_n", "tile_k"):
        out[name] = pick(name).astype(np.float64)
    out["cluster_m"], out["cluster_n"] = pick("cluster", 0).astype(np.float64), pick("cluster", 1).astype(np.float64)
    out["swap_ab"] = pick("swap_ab").astype(np.float64)
    d, schedulers = values["tile_scheduler"]
    out["stream_k"] = np.array([s is TileScheduler.STREAM_K for s in schedulers], dtype=np.float64)[chosen[:, d]]
    out["fast_accum"] = pick("fp8_fast_accum").astype(np.float64)
    # The other columns: one config per distinct combination of the knobs they depend on
    # (those of `_resolve`'s key and the columns read straight off a knob).
    resolved_by = ("tile_m", "tile_n", "tile_k", "stages", "kernel_schedule", "epilogue_schedule",
                   "epilogue_tile_n", "epilogue_source")
    first, inverse = _unique_rows([chosen[:, values[n][0]] for n in resolved_by])
    configs = [KernelConfig.for_operation(auto.operation, **{n: values[n][1][v] for n, v in zip(resolved_by, row)})
               for row in chosen[first][:, [values[n][0] for n in resolved_by]].tolist()]
    per_unique = config_columns(configs)
    for name in _COLUMNS:
        if name not in out:
            out[name] = per_unique[name][inverse]
    return out, chosen


def _value_indices(auto: AutoKernels) -> np.ndarray:
    """`auto.all_value_indices()` as an array (a row per valid config), built a knob at a time
    from `auto.graph()`: each row of the layer above repeated once per edge of its branch."""
    at_branch = np.zeros(1, dtype=np.int64)  # the graph entry each row has reached
    columns: list[np.ndarray] = []
    for layer in auto.graph():
        counts = np.array([len(edges) for edges in layer], dtype=np.int64)
        edges = np.array([edge for out in layer for edge in out], dtype=np.int64).reshape(-1, 2)
        per_row = counts[at_branch]
        parent = np.repeat(np.arange(len(at_branch)), per_row)
        first_edge = (np.cumsum(counts) - counts)[at_branch] - (np.cumsum(per_row) - per_row)
        edge = np.repeat(first_edge, per_row) + np.arange(int(per_row.sum()))
        columns = [c[parent] for c in columns] + [edges[edge, 0].astype(np.int16)]
        at_branch = edges[edge, 1]
    if not columns:  # no knob: the one config, where it is valid
        return np.zeros((len(auto), 0), dtype=np.int16)
    return np.stack(columns, axis=1)


def _unique_rows(columns: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of small non-negative integer columns, in sorted order: the index of
    each one's first row, and each row's distinct row. One number per row (np.unique over
    rows sorts them as bytes, seconds for hundreds of thousands)."""
    code = np.zeros(len(columns[0]) if columns else 0, dtype=np.int64)
    for column in columns:
        code = code * (int(column.max(initial=0)) + 1) + column
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


# ---- features -------------------------------------------------------------------------------
def _usable_sms(sm_count: int, ctas: np.ndarray) -> np.ndarray:
    """SMs a persistent kernel of clusters of `ctas` CTAs keeps busy: whole clusters only."""
    return np.floor(sm_count / ctas) * ctas


def features(problem: Problem, cols: Mapping[str, np.ndarray], sm_count: int) -> np.ndarray:
    """`FEATURES` of each config of `cols` (as `config_columns` gives them) on `problem`, on a
    GPU of `sm_count` SMs: an array of one row per config. A grouped problem's tiles along M
    are its experts' (each expert's rows round up to whole tiles of its own). An A/B-swapped
    config's tiles run over the transposed problem: its tile M over N, its tile N over M."""
    m, n, k = float(problem.m), float(problem.n), float(problem.k)
    swap = cols["swap_ab"].astype(bool)
    rows_m, cols_n = np.where(swap, n, m), np.where(swap, m, n)  # the kernel's problem
    tm, tn, tk = cols["tile_m"], cols["tile_n"], cols["tile_k"]
    cm, cn = cols["cluster_m"], cols["cluster_n"]
    ctas = cm * cn
    schedule = cols["schedule"]
    coop, pingpong, plain = schedule == 0, schedule == 1, schedule == 2
    stream_k = cols["stream_k"].astype(bool)
    in_bytes = cols["in_bits"] / 8
    tiles_m, tiles_n = np.ceil(rows_m / tm), np.ceil(cols_n / tn)
    if problem.group_rows:  # a grouped problem's experts
        rows_of = np.asarray(problem.group_rows, dtype=np.float64)[:, None]
        tiles_m = np.maximum(np.ceil(rows_of / np.asarray(tm, dtype=np.float64)[None, :]).sum(axis=0), 1.0)
    tiles = tiles_m * tiles_n
    # Persistent kernels launch whole clusters: the tile grid rounds up to the cluster shape.
    launched = np.ceil(tiles_m / cm) * cm * np.ceil(tiles_n / cn) * cn
    per_sm = np.where(plain, np.maximum(1.0, np.floor(SMEM_PER_SM / np.maximum(cols["total_bytes"], 1.0))), 1.0)
    slots = _usable_sms(sm_count, ctas) * np.where(pingpong, 2.0, per_sm)
    waves = launched / slots
    wave_fill = tiles / (np.ceil(waves) * slots)
    tail = waves - np.floor(waves)
    k_iters = np.ceil(k / tk)
    units = tiles * k_iters
    stream_k_fill = np.where(stream_k, units / (np.ceil(units / slots) * slots), 0.0)
    best_fill = np.maximum(wave_fill, stream_k_fill)
    pad_m, pad_n = rows_m / (tiles_m * tm), cols_n / (tiles_n * tn)
    k_pad = k / (k_iters * tk)
    intensity = 2 * tm * tn / ((tm + tn) * in_bytes)
    multicast = 2 * tm * tn / ((tm / cn + tn / cm) * in_bytes)
    accumulators = tm * tn / np.where(coop, 256.0, 128.0)
    extended = ~np.isin(tn, WGMMA_N_DEFAULT)
    work = np.ceil(waves) * k_iters * tm * tn * tk * np.where(pingpong, 2.0, 1.0) / per_sm
    rows = len(tm)
    ones = np.ones(rows)
    table = [
        ones * math.log2(m), ones * math.log2(n), ones * math.log2(k), cols["in_bits"], cols["out_bits"],
        ones * (problem.layout_a is Layout.ROW), ones * (problem.layout_b is Layout.COL),
        tm, tn, tk, np.log2(tm * tn), cm, cn, ctas,
        coop, pingpong, plain, stream_k, cols["no_smem"], cols["sourceless"], cols["epilogue_n"],
        cols["epilogue_auto"], cols["stages"], cols["stages_auto"], cols["pipeline_bytes"] / 1024,
        cols["fast_accum"], accumulators, extended,
        tiles_m, tiles_n, np.log2(tiles), slots, waves, wave_fill, tail, stream_k_fill, best_fill,
        pad_m, pad_n, pad_m * pad_n, tiles / launched, intensity, multicast, k_iters, k_pad,
        np.log2(work), best_fill * pad_m * pad_n * k_pad,
    ]
    assert len(table) == len(FEATURES), "one column per feature name"
    return np.stack([np.asarray(c, dtype=np.float64) for c in table], axis=1)


# ---- pools of configs -----------------------------------------------------------------------
GROUP_KNOBS = ("tile_m", "tile_n", "schedule")
"""A shape of kernel: configs that differ only in the other knobs (tile K, cluster, stages,
tile scheduler, epilogue) are variants of one another, which a short list should not spend
several picks on."""


class Pool:
    """Configs to rank: their columns (`config_columns`), a config per row built on demand,
    and their `GROUP_KNOBS` groups, each with a representative (the variant with the fewest
    knobs away from CUTLASS's defaults: auto stages and subtile, 128-byte K rows).

    Build it once per space and operand kind (`of_configs`, `of_auto`); read-only after."""

    def __init__(self, cols: dict[str, np.ndarray], build: Any):
        self.cols, self._build = cols, build
        # Each group knob's values by rank (its distinct values, sorted), then the groups.
        ranks = [np.unique(cols[g], return_inverse=True)[1].reshape(-1) for g in GROUP_KNOBS]
        self.group = _unique_rows(ranks)[1]
        plain = (cols["stages_auto"] * 4 + cols["epilogue_auto"] * 2
                 + (cols["tile_k"] * cols["in_bits"] == 128 * 8) * 8 + cols["sourceless"])
        order = np.lexsort((-plain, self.group))  # by group, the plainest first
        starts = np.flatnonzero(np.r_[True, np.diff(self.group[order]) != 0])
        self.representatives = order[starts]
        """One row per group."""
        self.members = np.split(order, starts[1:])
        """The rows of each group, the plainest first (group `g`'s at `members[g]`)."""

    def __len__(self) -> int:
        return len(self.group)

    def config(self, row: int) -> KernelConfig:
        return self._build(int(row))

    def rows(self, at: np.ndarray) -> dict[str, np.ndarray]:
        """The columns of the rows `at`."""
        return {name: col[at] for name, col in self.cols.items()}

    @classmethod
    def of_configs(cls, configs: Sequence[KernelConfig]) -> Pool:
        configs = list(configs)
        return cls(config_columns(configs), configs.__getitem__)

    @classmethod
    def of_auto(cls, auto: AutoKernels) -> Pool:
        """The valid configs of a `kernels: auto` kind (about two seconds for 190,240)."""
        cols, chosen = auto_columns(auto)
        return cls(cols, lambda row: auto.config_of(chosen[row].tolist()))
