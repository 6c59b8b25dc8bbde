"""The sweep's Optuna studies, one per problem, which every strategy asks and tells.

Each study (named from the problem, its operation, arch and GPU, and the space's choices where
another space's study holds that name) searches the compile-time knobs of its problem; a trial's
value is the config's best TFLOP/s over its run-time variants. Whatever a strategy proposes is a
trial of the problem's study (queued, then asked), so a study holds every config measured for it.
A proposal that is invalid, or already measured, is answered at once without a compile; one
already awaiting results (measured here or by another sweep on the store) waits with it. A
compiled kernel's result is added to every study of its operation, so one compile informs all
shapes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import random
import warnings
from collections.abc import Iterator, Sequence
from typing import overload

import optuna

from ..errors import CutlassTuneError
from ..space import KernelConfig, Problem, SearchSpace, check_config
from ..store import open_study_storage
from ._claims import Claims
from ._ledger import Ledger
from ._params import ParamSpace, config_of, params_of
from ._samplers import CONSTRAINT, METRIC, make_sampler

optuna.logging.set_verbosity(optuna.logging.WARNING)


def study_name(problem: Problem, arch: str, gpu: str) -> str:
    return f"{problem.name}_{arch}_{gpu.replace(' ', '-')}"


def _space_study_name(storage: optuna.storages.BaseStorage, name: str,
                      distributions: dict[str, optuna.distributions.BaseDistribution]) -> str:
    """`name`, or where the store's study of that name searched other choices of a knob (a
    second space file swept over the same problem: Optuna refuses to widen or narrow a
    parameter's choices), `name` and a digest of these choices: a study of its own, found again
    by the next sweep of the same space. The measurements stay the problem's, whatever study
    asked for them: tables rank them all."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return name
    seen: dict[str, optuna.distributions.BaseDistribution] = {}
    for trial in storage.get_all_trials(study_id, deepcopy=False):
        for param, dist in trial.distributions.items():
            seen.setdefault(param, dist)
    try:
        for param, dist in distributions.items():
            if param in seen:
                optuna.distributions.check_distribution_compatibility(seen[param], dist)
    except ValueError:
        text = repr(sorted((k, optuna.distributions.distribution_to_json(v)) for k, v in distributions.items()))
        return f"{name}_{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    return name


@dataclasses.dataclass(frozen=True)
class Study:
    """The Optuna study of one problem, over the knobs the space lists for its operation."""

    problem: Problem
    study: optuna.Study
    params: ParamSpace

    @property
    def name(self) -> str:
        return self.study.study_name


_Waiting = list[tuple[Study, optuna.trial.Trial]]


class Studies(Sequence[Study]):
    """The study of each problem of a space, in the space's order, and the trials awaiting
    results.

    Args:
        space: the search space.
        storage_url: where the studies live (created, or loaded to resume).
        sampler, seed: the Optuna sampler by name (`SAMPLERS`) and its seed.
        arch, gpu: what the study names carry.
        run_id: this sweep's run, named as the owner of the trials it asks.

    The trials awaiting results are held here, by config, from `ask` until `tell` (or
    `abandon`). Not thread-safe: use it from the sweep's thread.
    """

    def __init__(self, space: SearchSpace, storage_url: str, *, sampler: str, seed: int, arch: str, gpu: str,
                 run_id: str):
        if sampler == "grid" and space.auto:
            raise CutlassTuneError("the grid sampler cannot walk a kernels: auto space (millions of configs): "
                                   "use tpe, gp or random")
        self.space, self.run_id, self.seed_value = space, run_id, seed
        self.storage = open_study_storage(storage_url)
        self.studies: list[Study] = []
        for p in space.problems:
            params = ParamSpace.from_space(space, p)
            name = _space_study_name(self.storage, study_name(p, arch, gpu), params.distributions())
            study = optuna.create_study(study_name=name, storage=self.storage,
                                        sampler=make_sampler(sampler, seed=seed, grid=params.grid()),
                                        direction="maximize", load_if_exists=True)
            with warnings.catch_warnings():  # experimental since Optuna 3.2, kept through 5
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names([METRIC])
            self.studies.append(Study(p, study, params))
        self.invalid = 0
        """Proposals answered as invalid."""
        self._known: dict[str, set[str]] = {s.name: set() for s in self.studies}  # config hashes in each study
        self._waiting: dict[str, _Waiting] = {}  # config hash -> trials awaiting its results
        self._valid: dict[str, list[KernelConfig]] = {}  # study name -> a listed space's valid configs

    def __len__(self) -> int:
        return len(self.studies)

    @overload
    def __getitem__(self, i: int) -> Study: ...

    @overload
    def __getitem__(self, i: slice) -> list[Study]: ...

    def __getitem__(self, i: int | slice) -> Study | list[Study]:
        return self.studies[i]

    def awaits(self, cfg: KernelConfig) -> bool:
        """Whether trials await results of `cfg` (asked here, not yet told)."""
        return cfg.hash in self._waiting

    # ---- starting -------------------------------------------------------------------------
    def fail_left_over(self, live: set[str]) -> None:
        """Fail the running trials a dead sweep left (none of the `live` runs owns them), and
        learn which configs each study holds.

        A live sweep's trial is its own: should it be taken for dead, it adds its results as
        trials of their own (`_tell`). One without an owner may be one a live sweep is asking
        for this moment (`ask` names the owner right after)."""
        for s in self.studies:
            for t in s.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
                if t.user_attrs.get("run_id") in live or ("run_id" not in t.user_attrs and live):
                    continue
                with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # another sweep's look
                    self.storage.set_trial_user_attr(t._trial_id, "reason", "interrupted")
                    self.storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
            self._known[s.name].update(t.user_attrs["config_hash"] for t in s.study.get_trials(deepcopy=False)
                                       if "config_hash" in t.user_attrs)

    def enqueue(self, s: Study, cfg: KernelConfig) -> bool:
        """Queue `cfg` in the study `s`, asked before anything it samples, unless it is not of
        the study's space or the study holds it already. Whether it was queued."""
        if not s.params.has(cfg) or cfg.hash in self._known[s.name]:
            return False
        s.study.enqueue_trial(s.params.params(cfg), skip_if_exists=True)
        return True

    # ---- proposing ------------------------------------------------------------------------
    def expect(self, cfg: KernelConfig) -> None:
        """Await results of `cfg`, which no study asked for (an interrupted run's): `tell`
        adds them to every study. Asked as a seed, a study that holds the interrupted run's
        failed trial of it would skip it."""
        self._waiting.setdefault(cfg.hash, [])

    def ask_in(self, s: Study, ledger: Ledger, claims: Claims) -> KernelConfig | None:
        """Ask the study `s` (its sampler, or what was queued in it); the config to compile,
        claimed for this sweep, or None when the proposal needs no compile (invalid or measured:
        answered at once; awaited or claimed by another sweep: it waits for those results)."""
        try:
            trial = s.study.ask(s.params.distributions())
        except optuna.exceptions.UpdateFinishedTrialError:
            return None  # a sweep starting on the store took this one for dead as Optuna made the trial
        cfg = config_of(trial.params, s.problem)
        rejections = check_config(cfg)
        why = str(rejections[0]) if rejections else ""
        if not why and not s.params.has(cfg):
            why = "not in the search space"
        if why:
            self.invalid += 1
            self._tell(s, trial, cfg, None, reason=why, invalid=True)
            return None
        if cfg.hash in ledger.compiled and ledger.complete(cfg):
            value = ledger.value(s.problem, cfg.hash)
            self._tell(s, trial, cfg, value, reason="" if value else ledger.failure_reason(s.problem, cfg))
            return None
        # The trial waits for a measurement: name its owner, so that a sweep starting on the
        # store while this one lives leaves it alone even if a third one died (`fail_left_over`).
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # see `_tell`
            trial.set_user_attr("run_id", self.run_id)
        if cfg.hash in self._waiting:
            self._waiting[cfg.hash].append((s, trial))
            return None
        self._waiting[cfg.hash] = [(s, trial)]
        return cfg if claims.claim(cfg) else None

    def exhausted(self, s: Study, ledger: Ledger, claims: Claims) -> bool:
        """Whether asking `s` can only answer configs already known: in a listed space, every
        valid config of its problem is awaited here, held by another sweep, or compiled and
        measured whole. Asking such a study again only piles waiting trials onto it (each ask
        slower than the last, as Optuna reads them all). A `kernels: auto` space never is."""
        if self.space.auto:
            return False
        valid = self._valid.get(s.name)
        if valid is None:
            mapped = {c.hash: c for c in (config_of(params_of(c), s.problem) for c in self.space.candidates
                                          if s.params.has(c))}
            valid = self._valid[s.name] = [c for c in mapped.values() if not check_config(c)]
        return all(c.hash in self._waiting or c.hash in claims or (c.hash in ledger.compiled and ledger.complete(c))
                   for c in valid)

    def unproposed(self, want: int, ledger: Ledger, claims: Claims) -> list[KernelConfig]:
        """Up to `want` valid configs of the space never compiled, awaited or held by another
        sweep, in the file's order, asked by no study: for when the samplers stall (they keep
        proposing known or invalid configs, as in a short list of configs or a space whose rest
        other sweeps hold), so that a sweep does not stop short of `--trials` with configs left."""
        taken: list[KernelConfig] = []
        for cfg in self._fallback():
            if len(taken) == want:
                break
            if (cfg.hash in self._waiting or cfg.hash in ledger.compiled
                    or not any(s.params.has(cfg) for s in self.studies) or check_config(cfg)):
                continue
            if claims.claim(cfg, wait=False):  # else another sweep measures it: nothing waits on it here
                self.expect(cfg)
                taken.append(cfg)
        return taken

    def _fallback(self) -> Iterator[KernelConfig]:
        """The space's configs in the file's order; a `kernels: auto` space's (hundreds of
        thousands, the smallest tiles first), a few thousand at random."""
        if not self.space.auto:
            yield from self.space.candidates
            return
        n = len(self.space.candidates)
        for i in random.Random(self.seed_value).sample(range(n), min(n, 4096)):
            yield self.space.candidates[i]

    # ---- telling --------------------------------------------------------------------------
    def tell(self, cfg: KernelConfig, ledger: Ledger) -> None:
        """`cfg` is measured (as far as it will be): tell the trials awaiting it its figure on
        their problem (`ledger`), and add it to every other study of its operation."""
        asked = set()
        for s, trial in self._waiting.pop(cfg.hash, []):
            value = ledger.value(s.problem, cfg.hash)
            reason = "" if value else ledger.failure_reason(s.problem, cfg)
            self._tell(s, trial, config_of(trial.params, s.problem), value, reason=reason)
            asked.add(s.name)
        for s in self.studies:
            if s.name in asked or cfg.hash in self._known[s.name]:
                continue
            params = s.params.params(cfg)
            choices = s.params.choices
            if config_of(params, s.problem).hash != cfg.hash or any(params[k] not in choices[k] for k in params):
                continue  # another operation, or a value this study's parameters lack
            value = ledger.value(s.problem, cfg.hash)
            self._add_trial(s, params, cfg, value, "" if value is not None else ledger.failure_reason(s.problem, cfg))
            self._known[s.name].add(cfg.hash)

    def abandon(self, left_to_others: dict[str, KernelConfig]) -> None:
        """Fail the trials still awaiting results (an interrupt, or another sweep still
        measuring their configs, `left_to_others`), so that a resumed run does not wait on them;
        the other sweep adds its results to every study when it has them (`tell`)."""
        for cfg_hash, waiting in self._waiting.items():
            for s, trial in waiting:
                with contextlib.suppress(Exception):
                    if cfg_hash in left_to_others:
                        trial.set_user_attr("config_hash", cfg_hash)
                        trial.set_user_attr("config", left_to_others[cfg_hash].name)
                        trial.set_user_attr("reason", "measured by another sweep on the store")
                    else:  # a FAIL trial always says why (the dashboard lists each with its reason)
                        trial.set_user_attr("reason", "interrupted")
                    s.study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def _tell(self, s: Study, trial: optuna.trial.Trial, cfg: KernelConfig, value: float | None,
              reason: str = "", invalid: bool = False) -> None:
        self._known[s.name].add(cfg.hash)
        try:
            self._finish(s, trial, cfg, value, reason, invalid)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
            if not self.storage.get_trial(trial._trial_id).state.is_finished():
                raise
            # Another sweep on this store finished the trial first: it took this one for dead
            # and failed it as left over (`fail_left_over`), or it popped the same queued seed
            # (SQLite takes no row lock, so two sweeps can both start one WAITING trial), and
            # it may do so between any two of the calls above. Keep the result as a trial of
            # its own.
            self._add_trial(s, trial.params, cfg, value, reason, invalid)

    @staticmethod
    def _finish(s: Study, trial: optuna.trial.Trial, cfg: KernelConfig, value: float | None,
                reason: str, invalid: bool) -> None:
        trial.set_user_attr("config_hash", cfg.hash)
        trial.set_user_attr("config", cfg.name)
        with warnings.catch_warnings():  # the other sweep set it first: raised on by the tell below
            warnings.simplefilter("ignore", UserWarning)
            trial.set_constraint(CONSTRAINT, 1.0 if invalid else 0.0)
        if reason:
            trial.set_user_attr("reason", reason)
        if invalid:
            # Pruned, not complete: generic tools (optuna-dashboard, optuna.visualization) plot
            # and rank complete trials only, and TPE still counts a pruned trial among the worst.
            s.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        elif value is None:
            s.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            s.study.tell(trial, value)

    def _add_trial(self, s: Study, params: dict, cfg: KernelConfig, value: float | None,
                   reason: str = "", invalid: bool = False) -> None:
        """Add a finished trial of `cfg` to `s` without asking for it."""
        attrs = {"config_hash": cfg.hash, "config": cfg.name}
        if reason:
            attrs["reason"] = reason
        state = (optuna.trial.TrialState.PRUNED if invalid else optuna.trial.TrialState.COMPLETE
                 if value is not None else optuna.trial.TrialState.FAIL)
        s.study.add_trial(optuna.trial.create_trial(
            params=params, distributions=s.params.distributions(), value=value if not invalid else None,
            state=state,
            user_attrs=attrs, constraints={CONSTRAINT: 1.0 if invalid else 0.0}))
