"""Claims on a shared store: several sweeps (other hosts, other processes) on one store measure
each config once. A sweep claims a config in the store before compiling it; one that another
live sweep claimed first is left to that sweep, whose results it reads from the store when they
are complete, or takes over should that sweep stop or die first.
"""

from __future__ import annotations

from ..space import KernelConfig
from ..store import ResultStore
from ._ledger import Ledger


class Claims:
    """This sweep's side of the store's claims, and the configs it left to other sweeps.

    Args:
        store: the shared store (its `running(run_id)` must be entered while claiming).
        run_id: this sweep's run.
    """

    def __init__(self, store: ResultStore, run_id: str):
        self.store, self.run_id = store, run_id
        self.elsewhere: dict[str, KernelConfig] = {}
        """Configs another sweep is measuring, by hash, whose results this sweep waits for."""

    def __len__(self) -> int:
        return len(self.elsewhere)

    def __contains__(self, cfg_hash: object) -> bool:
        return cfg_hash in self.elsewhere

    def claim(self, cfg: KernelConfig, *, wait: bool = True) -> bool:
        """Claim `cfg` for this sweep: True when it is this sweep's to measure. False when
        another live sweep holds it; then, with `wait`, it is one of `elsewhere` until `settle`
        finds it finished or given up."""
        if self.store.claim(cfg.hash, self.run_id) is None:
            return True
        if wait:
            self.elsewhere[cfg.hash] = cfg
        return False

    def others(self) -> set[str]:
        """Hashes of the configs other live sweeps hold now."""
        return self.store.held_by_others(self.run_id)

    def settle(self, ledger: Ledger) -> tuple[list[KernelConfig], list[KernelConfig]]:
        """Of the configs left to other sweeps: those measured whole (as `ledger` last
        absorbed), and those given up unfinished (their sweep stopped or died), claimed now for
        this sweep to finish. Both leave `elsewhere`."""
        finished, taken = [], []
        for cfg in list(self.elsewhere.values()):
            if cfg.hash in ledger.compiled and ledger.complete(cfg):
                del self.elsewhere[cfg.hash]
                finished.append(cfg)
            elif self.claim(cfg, wait=False):
                del self.elsewhere[cfg.hash]
                taken.append(cfg)
        return finished, taken

    def release(self, cfg: KernelConfig) -> None:
        """Let go of this sweep's claim of `cfg` (measured whole)."""
        self.store.release(cfg.hash, self.run_id)
