"""The "optuna" strategy: the warm start's configs first, then each study's sampler in turn.

The warm start (`seed_configs`: CUTLASS's common choices, wave-fitting tiles, the best of the
nearest tuned problems, nvMatmulHeuristics' picks) is queued in the studies of its operation;
after it, the studies are asked in turn, each proposing by its sampler (TPE by default). When the
samplers stall, configs never proposed are taken in the space file's order (at random from a
`kernels: auto` space).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from ..space import KernelConfig, Operation
from ._claims import Claims
from ._ledger import Ledger
from ._params import config_of, params_of
from ._seeds import seed_configs
from ._strategy import StrategyContext, register_strategy
from ._studies import Study

ASKS_PER_CONFIG = 50
"""How many proposals `ask` may ask of the studies per config it wants (plus two configs' worth)
before it takes configs never proposed, in the file's order."""


class OptunaStrategy:
    """Proposes by the studies' samplers after the warm start (see the module's docstring)."""

    def __init__(self, context: StrategyContext):
        self.context, self.studies = context, context.studies
        self._turn = 0  # the study `ask` asks next

    def warm_start(self) -> None:
        """Queue the warm start's configs (`seed_configs`) before anything is sampled."""
        c = self.context
        self.seed(seed_configs(c.space, c.store, [s.problem for s in self.studies], c.gpu, c.sm_count))

    def seed(self, configs: Iterable[KernelConfig]) -> None:
        """Queue warm-start configs, each in a study of its operation, the studies of each
        operation taking turns."""
        studies_of: dict[Operation, list[Study]] = collections.defaultdict(list)
        for s in self.studies:
            studies_of[s.problem.operation].append(s)
        turns: collections.Counter = collections.Counter()
        for cfg in configs:
            same = studies_of.get(cfg.operation, [])
            if same:
                s = same[turns[cfg.operation] % len(same)]
                turns[cfg.operation] += 1
                self.studies.enqueue(s, config_of(params_of(cfg), s.problem))

    def ask(self, want: int, ledger: Ledger, claims: Claims) -> list[KernelConfig]:
        """Up to `want` configs to compile, each claimed for this sweep.

        Asks the studies in turn, where the last call stopped (with more problems than a batch
        holds, restarting at the first would leave the last studies never asked). After
        `ASKS_PER_CONFIG` asks per config wanted, takes configs never proposed
        (`Studies.unproposed`)."""
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
            cfg = self.studies.ask_in(s, ledger, claims)
            if cfg is not None:
                batch.append(cfg)
            if self.studies.exhausted(s, ledger, claims):
                closed.add(s.name)
        if len(batch) < want:
            batch += self.studies.unproposed(want - len(batch), ledger, claims)
        return batch

    def tell(self, cfg: KernelConfig, ledger: Ledger) -> None:
        self.studies.tell(cfg, ledger)


register_strategy("optuna", OptunaStrategy)
