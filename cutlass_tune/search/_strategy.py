"""What a sweep asks of a search strategy, and the strategies by name.

A strategy proposes the configs to compile: `ask` for a batch, `tell` when one is measured. It
proposes through the sweep's `Studies` (one Optuna study per problem), so every config measured
for a problem is a trial of its study whoever proposed it. Strategies register a factory under a
name (`register_strategy`); `make_strategy` builds the one a sweep's settings name. One module
each: search/_optuna_strategy.py ("optuna"), search/_prior_strategy.py ("prior").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

from ..measurement import TimingScheme
from ..space import KernelConfig, SearchSpace
from ..store import ResultStore
from ._claims import Claims
from ._ledger import Ledger
from ._studies import Studies


@dataclasses.dataclass(frozen=True)
class StrategyContext:
    """What a strategy is built from: the sweep's space, studies and store, and its GPU."""

    space: SearchSpace
    studies: Studies
    store: ResultStore
    gpu: str
    sm_count: int
    timing: TimingScheme
    """The store's timing scheme: which committed figures to learn from."""
    seed: int


class Strategy(Protocol):
    """Proposes configs to compile. Used from the sweep's thread only."""

    def warm_start(self) -> None:
        """Before the first `ask`: queue or rank the first configs (the store is read)."""

    def ask(self, want: int, ledger: Ledger, claims: Claims) -> list[KernelConfig]:
        """Up to `want` configs to compile, each claimed for this sweep (`claims`), none measured
        (`ledger`). Fewer, or none, when the strategy has nothing new to propose."""

    def tell(self, cfg: KernelConfig, ledger: Ledger) -> None:
        """`cfg` is measured (as far as it will be): its figures are in `ledger`."""


StrategyFactory = Callable[[StrategyContext], Strategy]
STRATEGIES: dict[str, StrategyFactory] = {}
"""Each strategy's factory by name, as `SweepSettings.strategy` and `sweep --strategy` name it."""


def register_strategy(name: str, factory: StrategyFactory) -> None:
    """Make `factory` the strategy called `name` (a user's own strategy too). Raises ValueError
    if the name is taken."""
    if name in STRATEGIES:
        raise ValueError(f"a strategy named {name!r} is registered already")
    STRATEGIES[name] = factory


def make_strategy(name: str | None, context: StrategyContext) -> Strategy:
    """The strategy `name` names; None: "prior" for a `kernels: auto` space, else "optuna".
    Raises ValueError for an unknown name."""
    name = name or ("prior" if context.space.auto else "optuna")
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}: use one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name](context)
