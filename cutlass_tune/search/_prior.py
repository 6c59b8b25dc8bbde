"""A prior over configs: how near a problem's best a config should come, before anything compiles.

A config is described by what a kernel engineer reads off it for a problem (`FEATURES`): wave
quantization per schedule (output tiles over the SMs a cluster shape can use, two tiles at a
time per SM for ping-pong, several CTAs per SM for the plain kernel, K split across SMs for
Stream-K) and the tail wave's fill; the padding tiles leave at the problem's edges; the tile's
arithmetic intensity, with TMA multicast across the cluster; K iterations; stages and shared
memory; epilogue (schedule, subtile, C operand); accumulator registers. A gradient-boosted
regressor (scikit-learn, imported only to fit) learns from measurements the log of a config's
ratio to cuBLAS over the best ratio of its problem, so that problems of any size teach it alike.

Its training rows (`Observation`s) come from the committed measurements of the same GPU model
(`committed_observations`, `COMMITTED`: results/measurements.csv.gz of a checkout, shipped in
the wheel as cutlass_tune/results/measurements.csv.gz) and from the sweep's own store
(`StoreObservations`, read a part at a time as it grows). Fitting 2,000 observations takes about
a second on one core (scikit-learn is held to one thread); ranking the 190,240 valid configs of
a bf16 `kernels: auto` kind for a problem, 0.2-0.4 s (each kernel shape by one variant, then
every variant of the best shapes). Nothing is cached on disk.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .._files import shipped
from ..space import Grouping, KernelConfig, Operation, Problem, Routing
from ..status import Status
from ..store import ResultStore
from ._features import FEATURES, Pool, config_columns, features

if TYPE_CHECKING:
    import pandas as pd

COMMITTED = shipped("results") / "measurements.csv.gz"
"""The committed measurements (`benchmarks/build_dataset.py`): results/ of a checkout, package
data of a wheel (pyproject.toml), so that an installed prior starts from them too."""
FLOOR = math.log(0.25)
"""Targets are clipped here: below a quarter of the best, how bad a config is does not matter,
and failures (spills, compile errors) would otherwise dominate the fit."""
FAILED = (Status.COMPILE_ERROR, Status.CANNOT_IMPLEMENT, Status.WRONG_RESULT, Status.RUNTIME_ERROR,
          Status.TIMEOUT)
"""Outcomes that say a config is no good on a problem (a sweep never compiles it again)."""


@dataclasses.dataclass(frozen=True)
class Observation:
    """A config's best ratio to cuBLAS on a problem (None: it failed there)."""

    problem: Problem
    config: KernelConfig
    ratio: float | None


# ---- training rows --------------------------------------------------------------------------
_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(KernelConfig) if f.name not in Operation.FIELDS)


def _problem_of(row: Mapping[str, Any]) -> Problem:
    operation = Operation.from_cells(row)
    if not operation.grouped:
        return Problem(int(row["m"]), int(row["n"]), int(row["k"]), **operation.operation_fields())
    return Problem(int(row["m"]), int(row["n"]), int(row["k"]), groups=int(row["groups"]),
                   routing=Routing(row["routing"]), group_rows=tuple(json.loads(row["group_rows"])),
                   **operation.operation_fields())


def _config_of(row: Mapping[str, Any], problem: Problem) -> KernelConfig:
    fields: dict[str, Any] = {}
    for f in _CONFIG_FIELDS:
        v = row.get(f)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        fields[f] = int(v) if isinstance(v, float) else v
    fields.update(problem.operation.to_dict())
    for flag in ("fp8_fast_accum", "epilogue_source", "swap_ab"):
        if isinstance(fields.get(flag), str):
            fields[flag] = fields[flag] == "True"
    return KernelConfig.from_dict(fields)


def committed_frame(path: str | Path = COMMITTED) -> pd.DataFrame:
    """The committed measurements table (`benchmarks/build_dataset.py`), kernels' rows only."""
    import pandas as pd

    frame = pd.read_csv(path, low_memory=False)
    return frame[~frame["is_baseline"].astype(bool)]


def committed_rows(frame: pd.DataFrame, gpu: str | None = None, method: str | None = None, *,
                   grouped: bool = False) -> pd.DataFrame:
    """The rows of `frame` (`committed_frame`) that teach the prior: ok (verified) with a ratio,
    of plain GEMMs (no fused epilogue or fp8 scales; the ratio to cuBLAS) or, with `grouped`, of
    plain grouped GEMMs (MoE experts; the ratio to torch._grouped_mm). With `gpu`, that GPU
    model's rows only, or every GPU's where it has none; with `method` ("events", "graph",
    "sustained"), that timing method's, or every method's where it has none."""
    rows = frame[(frame["status"] == Status.OK.value) & frame["ratio"].notna()]
    # A fused problem's ratio is to torch eager, not cuBLAS: its rows would teach the plain prior
    # another question.
    for column in ("epilogue", "scaling"):
        if column in rows:
            rows = rows[rows[column].isna() | (rows[column] == "none")]
    if "grouping" not in rows:
        rows = rows.iloc[:0] if grouped else rows
    else:
        is_grouped = rows["grouping"] == Grouping.GROUPED.value  # the weight gradients' rows are neither
        any_grouped = rows["grouping"].isin([Grouping.GROUPED.value, Grouping.GROUPED_K.value])
        rows = rows[is_grouped if grouped else ~any_grouped]
    if gpu is not None and (rows["gpu"] == gpu).any():
        rows = rows[rows["gpu"] == gpu]
    if method is not None and (rows["method"] == method).any():
        rows = rows[rows["method"] == method]
    return rows


def committed_observations(frame: pd.DataFrame, gpu: str | None = None, method: str | None = None, *,
                           grouped: bool = False) -> list[Observation]:
    """Each (problem, config)'s best ratio to its baseline in the `committed_rows` of `frame`
    (grouped problems carrying their experts' routed rows): the median over the runs that
    measured it of each run's best variant."""
    return observations_of(committed_rows(frame, gpu, method, grouped=grouped))


def observations_of(rows: pd.DataFrame) -> list[Observation]:
    """Each (problem, config)'s best ratio in `committed_rows` (of one kind: plain or grouped):
    the median over the runs that measured it of each run's best variant."""
    key = ["m", "n", "k", "dtype_a", "dtype_b", "dtype_d", "layout", "config_hash"]
    grouped = "grouping" in rows and bool((rows["grouping"] == "grouped").any())
    if grouped:  # experts, routing and routed rows are part of a grouped problem
        key = [*key[:-1], "groups", "routing", "group_rows", key[-1]]
    per_run = rows.groupby([*key, "source", "run_id"], sort=False)["ratio"].max()
    best = per_run.groupby(key, sort=False).median()
    first = rows.drop_duplicates(key).set_index(key)
    out = []
    for index, ratio in best.items():
        row = {**dict(zip(key, cast(tuple, index))), **first.loc[index].to_dict()}  # a MultiIndex's: a tuple
        problem = _problem_of(row)
        out.append(Observation(problem, _config_of(row, problem), float(ratio)))
    return out


class StoreObservations:
    """The observations of a results store, read a part at a time: `update` reads the rows
    added since the last call. A config's ratio on a problem is its best over the store's
    rows of it; one that only failed there counts as failed. Not thread-safe."""

    def __init__(self, store: ResultStore):
        self.store = store
        self._seen = 0
        self._best: dict[tuple[Problem, str], float | None] = {}
        self._configs: dict[str, KernelConfig] = {}

    def update(self) -> list[Observation]:
        """Every observation of the store, after reading the rows added since the last call."""
        rows = self.store.rows(["config_hash", "status", "ratio", "record"], after_id=self._seen)
        for row in rows:
            if row.config_hash is None or row.status in (None, Status.INVALID):
                continue
            valued = row.status in (Status.OK, Status.COARSE)  # coarse: far behind, which is worth learning
            if not valued and row.status not in FAILED:
                continue  # unstable: measured, but not to be ranked
            m = row.measurement()
            assert m.config is not None, "a row with a config hash holds its config"
            self._configs.setdefault(row.config_hash, m.config)
            key = (m.problem, row.config_hash)
            ratio = row.ratio if valued else None
            if ratio is not None or key not in self._best:
                self._best[key] = max(ratio, self._best.get(key) or 0.0) if ratio is not None else None
        if rows:
            self._seen = rows[-1].id
        return [Observation(p, self._configs[h], r) for (p, h), r in self._best.items()]


KNOB_FEATURES = ("tile_m", "tile_n", "tile_k", "cluster_m", "cluster_n", "stages", "epilogue_tile_n")
"""Features of a config's own knobs, whose values outside those fitted are an extrapolation."""
OUTSIDE_PENALTY = math.log(0.9)
"""Added to the score (a log ratio) for each `KNOB_FEATURES` value outside the fitted range."""
SCORED_WHOLE = 20_000
"""Pools up to this size are scored whole (0.3 s); larger ones (`kernels: auto`) in two steps."""
GROUPS_SCORED = 16
"""Kernel shapes whose every variant is scored, of a large pool (for bf16 `kernels: auto`, 16 of
about 100 shapes, some 30,000 variants: half a second)."""


def _one_thread() -> Any:
    """scikit-learn's OpenMP threads held to one: on a busy host (nvcc on every core, as during a
    sweep) two threads took 54 s to fit what one fits in 1 s, waiting at each tree's barrier."""
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]  # scikit-learn's own dependency

    return threadpool_limits(limits=1, user_api="openmp")


# ---- the model ------------------------------------------------------------------------------
def _targets(observations: Sequence[Observation]) -> tuple[np.ndarray, np.ndarray]:
    """Each observation's log ratio over its problem's best, clipped at FLOOR (FLOOR for a
    failure), and a weight that gives every problem the same total weight."""
    best: dict[Problem, float] = {}
    count: dict[Problem, int] = {}
    for o in observations:
        count[o.problem] = count.get(o.problem, 0) + 1
        if o.ratio:
            best[o.problem] = max(best.get(o.problem, 0.0), o.ratio)
    y = np.array([max(FLOOR, math.log(o.ratio / best[o.problem])) if o.ratio else FLOOR for o in observations])
    w = np.array([1.0 / count[o.problem] for o in observations])
    return y, w


def _feature_rows(observations: Sequence[Observation], sm_count: int) -> np.ndarray:
    by_problem: dict[Problem, list[int]] = {}
    for i, o in enumerate(observations):
        by_problem.setdefault(o.problem, []).append(i)
    out = np.empty((len(observations), len(FEATURES)))
    for problem, at in by_problem.items():
        out[at] = features(problem, config_columns(observations[i].config for i in at), sm_count)
    return out


@dataclasses.dataclass
class Prior:
    """The fitted model (`fit`), which scores configs for a problem (`score`): higher is nearer
    the problem's best (the predicted log ratio to it). Unfitted (no observations) it scores
    by the features alone: the share of the GPU's work the tiles do usefully."""

    sm_count: int
    model: Any = None
    rows: int = 0
    seen: dict[int, tuple[float, float]] = dataclasses.field(default_factory=dict)
    """The range of each `KNOB_FEATURES` column over the observations fitted, by column."""

    @classmethod
    def fit(cls, observations: Sequence[Observation], sm_count: int, *, seed: int = 0) -> Prior:
        """Fit on `observations` (the problems of which need at least one ratio each to teach
        anything). About a second for 5,000 observations on two cores."""
        with_best = {o.problem for o in observations if o.ratio}
        kept = [o for o in observations if o.problem in with_best]
        if not kept:
            return cls(sm_count)
        from sklearn.ensemble import HistGradientBoostingRegressor  # type: ignore[import-untyped]  # 1 s: to fit only

        y, w = _targets(kept)
        model = HistGradientBoostingRegressor(max_iter=200, learning_rate=0.08, max_leaf_nodes=15,
                                              min_samples_leaf=8, l2_regularization=1.0, random_state=seed)
        x = _feature_rows(kept, sm_count)
        with _one_thread():
            model.fit(x, y, sample_weight=w)
        seen = {i: (float(x[:, i].min()), float(x[:, i].max())) for i in map(FEATURES.index, KNOB_FEATURES)}
        return cls(sm_count, model, len(kept), seen)

    def score(self, problem: Problem, cols: Mapping[str, np.ndarray]) -> np.ndarray:
        """A score per config of `cols` (`config_columns`, or `Pool.rows`) on `problem`."""
        x = features(problem, cols, self.sm_count)
        if self.model is None:
            return np.log(np.maximum(x[:, FEATURES.index("useful_share")], 1e-6))
        with _one_thread():
            predicted = np.asarray(self.model.predict(x))
        # Trees extrapolate flat: a tile N of 16 where none below 32 was measured would score as
        # its nearest measured neighbour. Knob values outside the measured range pay for it.
        outside = sum(((x[:, i] < lo) | (x[:, i] > hi)).astype(np.float64) for i, (lo, hi) in self.seen.items())
        return predicted + OUTSIDE_PENALTY * outside

    def rank(self, problem: Problem, pool: Pool, *, diverse: bool = True, groups: int = GROUPS_SCORED) -> np.ndarray:
        """Rows of `pool` for `problem`, best first; with `diverse`, the best of each kernel
        shape (`GROUP_KNOBS`) before any second of a shape. A large pool is scored in two
        steps: each shape by its representative, then every variant of the `groups` best
        shapes (the rest are left out of the order)."""
        if len(pool) <= SCORED_WHOLE:
            rows = np.arange(len(pool))
        else:
            best = np.argsort(-self.score(problem, pool.rows(pool.representatives)), kind="stable")[:groups]
            rows = np.concatenate([pool.members[pool.group[pool.representatives[g]]] for g in best])
        scores = self.score(problem, pool.rows(rows))
        if not diverse:
            return rows[np.argsort(-scores, kind="stable")]
        return rows[diverse_order(scores, pool.group[rows])]


def diverse_order(scores: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Indices of `scores`, best first, the best of each group before any second of a group,
    and so on."""
    order = np.argsort(-scores, kind="stable")
    ranked_group = group[order]
    # Each row's rank within its group: its position in the order among rows of its group.
    by_group = np.argsort(ranked_group, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(ranked_group[by_group]) != 0])
    rank_in_group = np.empty(len(order), dtype=np.int64)
    rank_in_group[by_group] = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    return order[np.lexsort((np.arange(len(order)), rank_in_group))]
