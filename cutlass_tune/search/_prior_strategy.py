"""What to compile next, led by the prior: each problem's first configs are the prior's picks
for it, and later ones the prior's best unmeasured configs, mixed with the sampler's.

The prior (search/_prior.py) is fitted when the sweep starts, on the committed measurements of
the sweep's GPU model and on its store, and fitted again as the store grows (every
`REFIT_EVERY` new (config, problem) results). Until a problem has results of its own, its
proposals are the best variant of each of the prior's best kernel shapes in turn, with
nvMatmulHeuristics' picks (when the package is installed) after the first `HEURISTIC_AFTER`;
once it has, they are the prior's best unmeasured configs by score, one in `SAMPLER_EVERY`
left to the sampler (TPE: exploration). A compiled config is measured on every problem of its
kind, so the first batch (one config per problem and turn) gives every problem results.

Grouped problems (MoE experts) have a prior of their own, fitted only on grouped observations
(the committed grouped measurements of the GPU model and the store's; with none it ranks by the
features alone); a plain GEMM's measurements say nothing of a grouped kernel's speed, which
depends on the experts' rows. Their first picks are the hand-picked `GROUPED_DEFAULTS`, then the prior's.

A 16-bit problem whose epilogue applies an activation is led by `FUSED_DEFAULTS` (ping-pong
128x128, which led every such problem of the epilogue-gap sweep), then as a plain one.

fp8 problems' first picks are the hand-picked `FP8_DEFAULTS` (swapped small-M kernels first up
to `FP8_SMALL_M` rows): with no fp8 row committed, the prior fitted on 16-bit GEMMs led them with
256-row tiles of K 64 (64 bytes of fp8), which ran at 0.11-0.32 of torch._scaled_mm on an H100.
After them comes a prior of their own: fitted on the 16-bit and fp8 observations together (the
features carry the input width) until fp8 results cover `FP8_OWN_PRIOR_PROBLEMS` problems, then on
fp8 observations only. Not on fp8 rows alone from the start: with none, the features alone rank
64x16 tiles first at 4096^3.

The picks are configs of the space: of a `kernels: auto` space, any valid config, the
hand-written spaces' or not; of a space of knob lists, only the space's. Everything proposed is
a trial of the problem's Optuna study (queued, then asked), so a study holds every config
measured for it, whoever proposed it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

from ..measurement import TimingMethod
from ..space import Grouping, Inputs, KernelConfig, KindRegistry, Operation, Problem, SearchSpace
from . import _prior
from ._claims import Claims
from ._features import Pool
from ._ledger import Ledger
from ._optuna_strategy import ASKS_PER_CONFIG
from ._prior import Observation, Prior, StoreObservations
from ._seeds import fp8_defaults, fused_defaults, grouped_defaults, heuristic_configs
from ._strategy import StrategyContext, register_strategy
from ._studies import Study

HEURISTIC_AFTER = 2
"""nvMatmulHeuristics' picks join a problem's first picks after this many of the prior's."""
SAMPLER_EVERY = 4
"""Once a problem has results, one proposal in this many is the sampler's (TPE: exploration),
the others the prior's best unmeasured config for the problem."""
FP8_OWN_PRIOR_PROBLEMS = 4
"""fp8 problems with results from which fp8 problems' prior is fitted on fp8 observations only."""
REFIT_EVERY = 16
"""New (config, problem) results in the store after which the prior is fitted again."""
PICKS_KEPT = 512
"""Configs of each problem's ranking kept between fits (a sweep proposes far fewer)."""
log = logging.getLogger(__name__)


def load_committed(gpu: str, method: TimingMethod) -> list[Observation]:
    """The committed measurements as the prior's observations: the GPU model's (all GPUs' where
    it has none) by the store's timing method. Logs (INFO, `cutlass-tune -v`) what they are:
    the file, its rows taken, their GPUs, timing methods and operations. Empty, with a warning,
    where the file is missing (an install that lost its package data)."""
    path = _prior.COMMITTED
    if not path.is_file():
        log.warning("no committed measurements at %s: the prior learns from this store alone", path)
        return []
    frame = _prior.committed_frame(path)
    observations: list[Observation] = []
    for grouped in (False, True):
        rows = _prior.committed_rows(frame, gpu, method.value, grouped=grouped)
        found = _prior.observations_of(rows)
        gpus = sorted(rows["gpu"].unique())
        log.info("prior's committed measurements (%s): %s, %d rows (%d config-problem pairs, %d problems) of %s%s, "
                 "timed by %s; operations %s", "grouped GEMMs" if grouped else "GEMMs", path, len(rows), len(found),
                 len({o.problem for o in found}), ", ".join(gpus) or "no GPU",
                 "" if gpu in gpus or not gpus else f" (none of {gpu}, so every GPU's)",
                 ", ".join(sorted(rows["method"].unique())) or "-",
                 ", ".join(sorted({o.problem.operation.name for o in found})) or "none")
        observations += found
    return observations


class PriorStrategy:
    """Proposes configs by the prior first (see the module's docstring), through the sweep's
    studies, whose samplers it asks for one proposal in `SAMPLER_EVERY`.

    Args:
        context: the sweep's space, studies, store (whose measurements the prior learns from as
            they come) and GPU.
        committed: observations from other stores (`load_committed`).
    """

    def __init__(self, context: StrategyContext, committed: Sequence[Observation] = ()):
        self.space, self.studies, self.gpu = context.space, context.studies, context.gpu
        self.sm_count, self.committed = context.sm_count, list(committed)
        self.observed = StoreObservations(context.store)
        self.prior = Prior(self.sm_count)
        self.grouped_prior = Prior(self.sm_count)
        """The prior of grouped problems, fitted on grouped observations only."""
        self.fp8_prior = Prior(self.sm_count)
        """The prior of fp8 (not grouped) problems (see the module's docstring)."""
        self.fits = 0
        self._results = -1  # store results at the last fit
        self._pools: dict[Operation, Pool] = {}
        self._ranked: dict[str, list[KernelConfig]] = {}  # study name -> its picks, best first
        self._heuristic: dict[str, list[KernelConfig]] = {}  # study name -> nvMatmulHeuristics' picks
        self._answered: set[Problem] = set()  # problems with results of their own at the last fit
        self._proposals = 0
        self._turn = 0  # the study `ask` asks next

    @classmethod
    def create(cls, context: StrategyContext) -> PriorStrategy:
        """The strategy, learning from the committed measurements of the GPU model and timing."""
        return cls(context, load_committed(context.gpu, context.timing.method))

    # ---- the prior ------------------------------------------------------------------------
    def _pool(self, problem: Problem) -> Pool:
        """The configs of the space that compute `problem`'s operation, with their features."""
        operation = problem.operation
        if operation not in self._pools:
            auto = self.space.auto_for(problem)
            self._pools[operation] = (Pool.of_auto(auto) if auto is not None else Pool.of_configs(
                [c for c in self.space.valid if c.operation == operation]))
        return self._pools[operation]

    def refit(self, *, force: bool = False) -> bool:
        """Fit the prior again if the store holds `REFIT_EVERY` results more than at the last
        fit (or `force`), and rank each problem's configs by it. Whether it was fitted."""
        own = self.observed.update()
        if not force and len(own) < self._results + REFIT_EVERY:
            return False
        start = time.monotonic()
        grouped = [o for o in self.committed + own if _family(o.problem) == "grouped"]
        fp8 = [o for o in self.committed + own if _family(o.problem) == "fp8"]
        plain = [o for o in self.committed + own if _family(o.problem) == "plain"]
        has = {_family(s.problem) for s in self.studies}
        has_grouped, has_plain = "grouped" in has, "plain" in has
        if has_plain:
            self.prior = Prior.fit(plain, self.sm_count)
        if has_grouped:
            self.grouped_prior = Prior.fit(grouped, self.sm_count)
        if "fp8" in has:
            own_fp8 = len({o.problem for o in fp8 if o.ratio}) >= FP8_OWN_PRIOR_PROBLEMS
            self.fp8_prior = Prior.fit(fp8 if own_fp8 else plain + fp8, self.sm_count)
        priors = {"plain": self.prior, "grouped": self.grouped_prior, "fp8": self.fp8_prior}
        self._results, self.fits = len(own), self.fits + 1
        self._answered = {o.problem for o in own}
        for s in self.studies:
            answered = s.problem in self._answered
            pool = self._pool(s.problem)
            family = _family(s.problem)
            rows = priors[family].rank(s.problem, pool, diverse=not answered)[:PICKS_KEPT]
            picks = [pool.config(r) for r in rows]
            lead = FAMILIES[s.problem.kind].first_picks
            if not answered and lead is not None:  # its first picks: the hand-picked configs of its family
                first = lead(s.problem, self.space)
                picks = first + [c for c in picks if c not in first]
            elif not answered:  # its first picks: nvMatmulHeuristics' join the prior's, one by one
                picks = _interleave(picks, self._heuristic.get(s.name, []), HEURISTIC_AFTER)
                first = fused_defaults(s.problem, self.space)  # an activation's epilogue: ping-pong first
                picks = first + [c for c in picks if c not in first]
            self._ranked[s.name] = picks
        if has_plain:
            log.info("prior fitted on %d observations (%d of the store) and ranked in %.1f s",
                     self.prior.rows, sum(_family(o.problem) == "plain" for o in own), time.monotonic() - start)
        if has_grouped:
            log.info("%s", self.grouped_fit)
        if "fp8" in has:
            log.info("fp8 problems: prior fitted on %d observations (%s), after the hand-picked fp8 configs",
                     self.fp8_prior.rows, "fp8 only" if own_fp8 else
                     f"16-bit and fp8: fp8 results of fewer than {FP8_OWN_PRIOR_PROBLEMS} problems")
        return True

    @property
    def grouped_fit(self) -> str:
        """What the prior of grouped problems was fitted on, in words."""
        if self.grouped_prior.model is None:
            return ("grouped problems: prior fitted on no grouped measurement (neither the committed table nor "
                    "the store has one); first picks are the hand-picked grouped configs, then the features alone")
        committed = sum(_family(o.problem) == "grouped" for o in self.committed)
        return (f"grouped problems: prior fitted on {self.grouped_prior.rows} grouped observations ({committed} "
                "committed, the rest of the store; no plain GEMM's), after the hand-picked grouped configs")

    def picks(self, s: Study, count: int) -> list[KernelConfig]:
        """The first `count` configs the prior would propose for `s`'s problem, measured or not."""
        return self._ranked.get(s.name, [])[:count]

    # ---- proposing ------------------------------------------------------------------------
    def warm_start(self) -> None:
        """Fit the prior, and take nvMatmulHeuristics' picks for each problem. Nothing is
        queued: `ask` proposes."""
        for s in self.studies:
            self._heuristic[s.name] = [c for c in heuristic_configs(s.problem, self.gpu) if s.params.has(c)]
        self.refit(force=True)

    def ask(self, want: int, ledger: Ledger, claims: Claims) -> list[KernelConfig]:
        """Up to `want` configs to compile, study by study: the prior's next pick not yet
        measured, awaited or held by another sweep (once the problem has results, one proposal
        in `SAMPLER_EVERY` the sampler's instead)."""
        self.refit()
        batch: list[KernelConfig] = []
        closed = {s.name for s in self.studies if self.studies.exhausted(s, ledger, claims)}
        for _ in range(ASKS_PER_CONFIG * (max(want, 1) + 2)):
            if len(batch) >= want:
                break
            s = self.studies[self._turn % len(self.studies)]
            self._turn += 1
            if s.name in closed:
                if len(closed) == len(self.studies):
                    break
                continue
            explore = s.problem in self._answered and self._proposals % SAMPLER_EVERY == SAMPLER_EVERY - 1
            self._proposals += 1
            if not explore:
                self._queue_best(s, ledger, claims)
            cfg = self.studies.ask_in(s, ledger, claims)
            if cfg is not None:
                batch.append(cfg)
            if self.studies.exhausted(s, ledger, claims):
                closed.add(s.name)
        if len(batch) < want:
            batch += self.studies.unproposed(want - len(batch), ledger, claims)
        return batch

    def tell(self, cfg: KernelConfig, ledger: Ledger) -> None:
        """Tell the studies; the prior learns from the store at its next refit."""
        self.studies.tell(cfg, ledger)

    def _queue_best(self, s: Study, ledger: Ledger, claims: Claims) -> None:
        """Queue in `s` the prior's first pick for it not measured, awaited or held elsewhere."""
        for cfg in self._ranked.get(s.name, []):
            if cfg.hash in ledger.compiled or self.studies.awaits(cfg) or cfg.hash in claims:
                continue
            if self.studies.enqueue(s, cfg):
                return


@dataclasses.dataclass(frozen=True)
class PriorFamily:
    """The prior that ranks a kind's problems (`FAMILIES`), by name ("plain", "fp8", "grouped":
    each is fitted on its own observations, see the module's docstring), and what leads a problem
    of it before it has results: its hand-picked configs, or, where None, nvMatmulHeuristics'
    picks among the prior's and the fused defaults first (16-bit GEMMs)."""

    name: str
    first_picks: Callable[[Problem, SearchSpace], list[KernelConfig]] | None = None


FAMILIES: KindRegistry[PriorFamily] = KindRegistry("prior family")
"""The prior family of each kind: 16-bit GEMMs "plain", fp8 ones (scaled in the epilogue or
block-wise) "fp8", grouped GEMMs and their weight gradients "grouped"."""
FAMILIES.add(PriorFamily("plain"))
FAMILIES.add(PriorFamily("fp8", fp8_defaults), grouping=Grouping.NONE, inputs=Inputs.FP8)
FAMILIES.add(PriorFamily("fp8", fp8_defaults), grouping=Grouping.NONE, inputs=Inputs.FP8_BLOCKWISE)
FAMILIES.add(PriorFamily("grouped", grouped_defaults), grouping=Grouping.GROUPED)
# The weight gradients share the grouped prior's fit for now (their own once measured rows exist),
# led by their own hand-picked configs (`GROUPED_K_DEFAULTS`).
FAMILIES.add(PriorFamily("grouped", grouped_defaults), grouping=Grouping.GROUPED_K)


def _family(problem: Problem) -> str:
    """Which prior ranks `problem`'s configs (`FAMILIES`): grouped, fp8 or plain (16-bit GEMMs)."""
    return FAMILIES[problem.kind].name


def _interleave(ours: list[KernelConfig], theirs: list[KernelConfig], after: int) -> list[KernelConfig]:
    """`ours` with `theirs` taken in turn after the first `after` of ours."""
    out = ours[:after]
    for i in range(max(len(ours) - after, len(theirs))):
        out += theirs[i:i + 1] + ours[after + i:after + i + 1]
    return out


register_strategy("prior", PriorStrategy.create)
