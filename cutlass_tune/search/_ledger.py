"""What the store says is done: the configs compiled, the run-time variants measured of each
(problem, config), and the best figure of each.

The ledger reads the store's rows once and then only those added since its last look
(`absorb`), so it sees what this sweep, earlier runs and other sweeps on the same store have
measured without reading everything again.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..measurement import Measurement
from ..space import KernelConfig, Problem, RuntimeArgs, SearchSpace, check_config
from ..status import Status
from ..store import ResultStore
from ._params import config_of, params_of

_Key = tuple[str, str]  # (problem name, config hash)


class Ledger:
    """Args:
        store: where the measurements are (read, never written, here).
        space: the configs and run-time variants of the sweep.
        problems: the sweep's problems; a config is complete once measured on each that has
            its types and layouts.

    Not thread-safe: use it from the sweep's thread.
    """

    def __init__(self, store: ResultStore, space: SearchSpace, problems: Sequence[Problem]):
        self.store, self.space, self.problems = store, space, tuple(problems)
        self.compiled: set[str] = set()
        """Hashes of the configs compiled for the store (those of rows not refused as invalid,
        and those `add_compiled` names)."""
        self._runtimes: dict[_Key, set[str]] = {}
        self._best: dict[_Key, float | None] = {}
        self._seen_id = 0  # the last store row read
        self._candidates: dict[str, KernelConfig] = {}
        """The space's configs by hash: a list's, all; `kernels: auto`'s (too many to list),
        those the store or this sweep has measured."""
        for c in () if space.auto else space.candidates:
            self._candidates.setdefault(c.hash, c)
        self._foreign: set[str] = set()  # hashes in the store of configs not in the space

    def absorb(self) -> None:
        """Read the store's rows added since the last call: at the start those of earlier runs,
        later those of other sweeps on the store (other hosts) and this sweep's own."""
        columns = ["problem", "config_hash", "runtime", "status", "tflops"] + (["record"] if self.space.auto else [])
        rows = self.store.rows(columns, after_id=self._seen_id)
        for row in rows:
            if row.config_hash is None:
                continue  # the cuBLAS baseline, or a hand-written kernel
            known = row.config_hash in self._candidates or row.config_hash in self._foreign
            if row.record is not None and not known:
                self._learn(row.measurement().config)
            assert row.problem is not None and row.runtime is not None, "columns read, never NULL"
            if row.status is not Status.INVALID:
                self.compiled.add(row.config_hash)
            valued = row.status in (Status.OK, Status.COARSE)  # a coarse figure steers the search
            self._add((row.problem, row.config_hash), row.runtime, row.tflops if valued else None)
        if rows:
            self._seen_id = rows[-1].id

    def note(self, m: Measurement) -> None:
        """Count `m`, a kernel's measurement this sweep has just stored."""
        assert m.config is not None, "a baseline is no kernel's measurement"
        if self.space.auto and m.config.hash not in self._candidates:
            self._learn(m.config)
        valued = m.status in (Status.OK, Status.COARSE)
        self._add((m.problem.name, m.config.hash), m.runtime.name, m.tflops if valued else None)

    def _learn(self, cfg: KernelConfig | None) -> None:
        """Know `cfg`, measured, by its hash if it is one of the (`kernels: auto`) space's."""
        if cfg is not None and self.space.holds(cfg):
            self._candidates[cfg.hash] = cfg
        elif cfg is not None:
            self._foreign.add(cfg.hash)

    def _add(self, key: _Key, runtime: str, tflops: float | None) -> None:
        self._runtimes.setdefault(key, set()).add(runtime)
        if tflops:
            self._best[key] = max(self._best.get(key) or 0.0, tflops)
        else:
            self._best.setdefault(key, None)

    def add_compiled(self, cfg_hashes: Sequence[str]) -> None:
        """Count configs this sweep compiled (before any of their rows is stored)."""
        self.compiled.update(cfg_hashes)

    def fail(self, problem: Problem, cfg_hash: str) -> None:
        """The config has no figure on `problem`, whatever was measured of it before (it no
        longer compiles)."""
        self._best[(problem.name, cfg_hash)] = None

    def tried(self, problem: Problem, cfg_hash: str) -> bool:
        """Whether the store holds any row of the config on `problem`."""
        return bool(self._runtimes.get((problem.name, cfg_hash)))

    def value(self, problem: Problem, cfg_hash: str) -> float | None:
        """The best TFLOP/s of the config on `problem` over its variants; None when it failed
        or was not measured."""
        return self._best.get((problem.name, cfg_hash))

    def missing(self, cfg: KernelConfig, problem: Problem) -> list[RuntimeArgs]:
        """The run-time variants of `cfg` not yet measured on `problem`."""
        have = self._runtimes.get((problem.name, cfg.hash), set())
        return [v for v in self.space.runtime_variants(cfg) if v.name not in have]

    def complete(self, cfg: KernelConfig) -> bool:
        """Whether `cfg` was measured on every problem of its kind, every variant."""
        return not any(self.missing(cfg, p) for p in self.problems if config_of(params_of(cfg), p).hash == cfg.hash)

    def unfinished(self) -> list[KernelConfig]:
        """Valid configs of the space compiled for the store but not measured whole (an
        interrupted run's, or one a dead sweep left): to finish before proposing more."""
        out: dict[str, KernelConfig] = {}
        for cfg_hash in self.compiled:
            for p in self.problems:
                cfg = self.config_for(cfg_hash, p)
                # Regression: another layout's twin of a config (same knobs, other hash) was
                # taken for unfinished, and a resumed sweep compiled it unasked.
                if cfg is not None and cfg.hash == cfg_hash and not check_config(cfg) and self.missing(cfg, p):
                    out[cfg_hash] = cfg
        return list(out.values())

    def config_for(self, cfg_hash: str, problem: Problem) -> KernelConfig | None:
        """The space's config of that hash, on `problem`'s types; None when the space has none
        (or, in `kernels: auto`, none measured has it)."""
        cfg = self._candidates.get(cfg_hash)
        return config_of(params_of(cfg), problem) if cfg is not None else None

    def failure_reason(self, problem: Problem, cfg: KernelConfig) -> str:
        """Why the config has no figure on `problem`: the first failure the store holds."""
        for (h, _), found in self.store.measured(problem).items():
            if h == cfg.hash:
                for r in found:
                    if r.status is not None and r.status is not Status.OK:
                        return f"{r.status.value}: {r.reason}"[:300]
        return "no result"
