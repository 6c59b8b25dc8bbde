"""`kernels: auto`: every config the knobs declare for one operand kind, counted and indexed
without building the configs it does not need.

The configs are the product of each knob's `Knob.auto_values` (its default alone where it
declares none or does not apply to the kind); the rules of space/_rules.py decide which are
valid. The product runs to millions (16.9 million for bf16, 190,240 of them valid), so it is
never listed: it is walked one knob at a time, and a rule is decided as soon as the fields it
reads (`_rules.CONFIG_RULES`) are set. A branch whose first failing rule is decided, with every
rule before it decided too, is counted whole by multiplication (tile K 256 of a 16-bit kind:
one step, 4.2 million configs). Branches that differ only in fields no undecided rule reads
are one branch, walked once: the cluster shape, which only `cluster_size` reads, multiplies
the rest instead of repeating it. The walk leaves a graph of the valid branches with their
counts, through which the i-th valid config is found in a few steps (`AutoKernels[i]`) and
the valid ones are listed lazily. Counting a 16-bit kind takes about two seconds.

An invalid config is counted under the first rule `check_config` gives for it, as a space
file's are.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import types
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, overload

from . import _rules
from ._knobs import KernelConfig, Knob
from ._operation import Operation

_FIXED_FIELDS = tuple(f.name for f in dataclasses.fields(KernelConfig)
                      if f.name not in {field for k in KernelConfig.knobs for field in k.fields})
"""Fields no knob sets: the operands' types and layouts, the accumulator, the arch."""
_RULE_ORDER = {rule: i for i, (rule, _) in enumerate(_rules.CONFIG_RULES)}


@dataclasses.dataclass(frozen=True)
class Census:
    """How many configs a space describes, how many are valid, and why the others are not."""

    total: int
    valid: int
    invalid: dict[str, int]
    """Invalid configs by the first rule that refuses them, most first."""
    examples: dict[str, str]
    """One reason each rule gave."""

    @staticmethod
    def of(total: int, valid: int, invalid: Mapping[str, int], examples: Mapping[str, str]) -> Census:
        ordered = dict(sorted(((r, n) for r, n in invalid.items() if n), key=lambda item: (-item[1], item[0])))
        return Census(total, valid, ordered, {r: examples[r] for r in ordered})

    @staticmethod
    def combined(parts: Sequence[Census]) -> Census:
        invalid: Counter[str] = Counter()
        examples: dict[str, str] = {}
        for part in parts:
            invalid.update(part.invalid)
            for rule, reason in part.examples.items():
                examples.setdefault(rule, reason)
        return Census.of(sum(p.total for p in parts), sum(p.valid for p in parts), invalid, examples)


class _Branch:
    """The configs below one point of the walk: valid count, invalid counts by rule, and the
    values of the next knob that lead to valid ones (each with its branch)."""

    __slots__ = ("invalid", "next", "valid")

    def __init__(self, valid: int, invalid: dict[str, int], nxt: tuple[tuple[int, _Branch], ...]):
        self.valid, self.invalid, self.next = valid, invalid, nxt


_VALID = _Branch(1, {}, ())
"""A config every rule accepts."""


def _field_value(knob: Knob, cfg: KernelConfig) -> Any:
    return getattr(cfg, knob.fields[0]) if len(knob.fields) == 1 else tuple(getattr(cfg, f) for f in knob.fields)


def _fields_of(knob: Knob, value: Any) -> dict[str, Any]:
    return dict(zip(knob.fields, value if len(knob.fields) > 1 else (value,)))


def _getter(names: Sequence[str]) -> Callable[[Mapping[str, Any]], Any]:
    """The values of `names` in a mapping, as one hashable key (a C-level itemgetter: the walk
    takes hundreds of thousands)."""
    if not names:
        return lambda _: ()
    return operator.itemgetter(*names)


def _walk_order(knobs: Sequence[tuple[Knob, tuple[Any, ...]]]) -> list[int]:
    """Knob positions in the order the walk sets them: those of one value first, then the
    knobs each rule reads, rule by rule in `check_config`'s order (so that rules are decided
    early and in order), the rest last."""
    order = [i for i, (_, values) in enumerate(knobs) if len(values) == 1]
    for _, reads in _rules.CONFIG_RULES:
        order += [i for i, (knob, _) in enumerate(knobs) if i not in order and reads & set(knob.fields)]
    return order + [i for i in range(len(knobs)) if i not in order]


class AutoKernels(Sequence[KernelConfig]):
    """The valid configs of `kernels: auto` for one operation, as a sequence (length, the
    i-th, iteration in a fixed order) that builds only the configs asked for; `census` counts
    every config of the product, valid or not, by rule.

    Args:
        operation: what every config computes (`KernelConfig.for_operation`).
        values: values of some knobs, by name, in place of their `auto_values`.

    Raises:
        ValueError: a knob declares an auto value its own rule refuses.

    The walk runs once, on first use (about two seconds), and is kept: share one instance.
    Thread-safe once walked.
    """

    def __init__(self, operation: Operation, values: Mapping[str, Sequence[Any]] | None = None):
        self.operation = operation.operation
        base = KernelConfig.for_operation(self.operation)
        declared: list[tuple[Knob, tuple[Any, ...]]] = []
        for knob in KernelConfig.knobs:
            given = tuple((values or {}).get(knob.name, ()))
            default = knob.auto_values if knob.auto_values and knob.applies_to(base) else (_field_value(knob, base),)
            for value in given or default:
                problems = knob.problems(types.SimpleNamespace(**_fields_of(knob, value)))
                if problems:
                    raise ValueError(f"auto value {value!r} of {knob.name}: {problems[0][1]}")
            declared.append((knob, given or default))
        order = _walk_order(declared)
        self.knobs: tuple[tuple[Knob, tuple[Any, ...]], ...] = tuple(declared[i] for i in order)
        """Each knob with its values, in the walk's order (the order of `value_indices`)."""
        self.total = math.prod(len(values) for _, values in self.knobs)
        """Configs of the product, valid or not."""
        self._below = [math.prod(len(v) for _, v in self.knobs[d:]) for d in range(len(self.knobs) + 1)]
        self._set = [frozenset(_FIXED_FIELDS).union(*(k.fields for k, _ in self.knobs[:d]))
                     for d in range(len(self.knobs) + 1)]
        self._examples: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"AutoKernels({self.operation.name})"

    # ---- the walk -------------------------------------------------------------------------
    @functools.cached_property
    def _root(self) -> _Branch:
        rules = _rules.CONFIG_RULES
        refused = _rules.check_operands(KernelConfig.for_operation(self.operation))
        if refused:  # a kind no kernel is built for: every config of it, for the first reason
            self._examples[refused[0].rule] = refused[0].reason
            return _Branch(0, {refused[0].rule: self.total}, ())
        # What the walk knows at each depth (knobs set): which rules are decided, the first
        # undecided one, and the set knob fields that undecided rules read. Two branches that
        # agree on those fields, and on the first rule that refused them, have the same counts.
        decided = [[reads <= is_set for _, reads in rules] for is_set in self._set]
        self._decided = decided
        self._first_open = [next((i for i, known in enumerate(d) if not known), len(rules)) for d in decided]
        reads_open = [frozenset().union(*(reads for (_, reads), known in zip(rules, d) if not known))
                      for d in decided]
        depths = range(len(self.knobs) + 1)
        knob_fields = [frozenset(f for k, _ in self.knobs[:d] for f in k.fields) for d in depths]
        self._key_fields = [tuple(sorted(knob_fields[d] & reads_open[max(d - 1, 0)])) for d in depths]
        self._rest = [self._fields([0] * (len(self.knobs) - d), start=d) for d in range(len(self.knobs) + 1)]
        self._value_fields = [[_fields_of(knob, value) for value in values] for knob, values in self.knobs]
        # The rules decided first at each depth, and the knob fields they read: only they can
        # refuse a branch its parent did not (the parent decided the others on the same fields).
        self._new_rules = [frozenset(i for i, known in enumerate(decided[d]) if known and not (d and decided[d - 1][i]))
                           for d in depths]
        self._new_reads = [tuple(sorted(knob_fields[d] & frozenset().union(*(rules[i][1] for i in self._new_rules[d]))))
                           for d in depths]
        self._refusals: list[dict[tuple, tuple[tuple[int, str, str], ...]]] = [{} for _ in depths]
        self._key_of = [_getter(f) for f in self._key_fields]
        self._new_key_of = [_getter(f) for f in self._new_reads]
        return self._branch(0, {}, None, {})

    def _newly_refused(self, depth: int, fields: dict[str, Any]) -> tuple[tuple[int, str, str], ...]:
        """The rules first decided at `depth` that refuse the branch of `fields`, as (position in
        `CONFIG_RULES`, rule, reason) in `check_combinations`' order. A rule's verdict depends on
        the fields it reads alone, so it is computed once per their values: the walk's branches
        share a few hundred (a cluster shape: 9) where it meets hundreds of thousands."""
        if not self._new_rules[depth]:
            return ()
        key = self._new_key_of[depth](fields)
        found = self._refusals[depth].get(key)
        if found is None:
            cfg = KernelConfig.for_operation(self.operation, **fields, **self._rest[depth])
            refused = []
            for r in _rules.check_combinations(cfg):
                at = _RULE_ORDER.get(r.rule)
                assert at is not None, f"rule {r.rule} is missing from _rules.CONFIG_RULES"
                if at in self._new_rules[depth]:
                    refused.append((at, r.rule, r.reason))
            found = self._refusals[depth][key] = tuple(refused)
        return found

    def _fields(self, chosen: Sequence[int], start: int = 0) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        for (knob, values), v in zip(self.knobs[start:], chosen):
            fields.update(_fields_of(knob, values[v]))
        return fields

    def _config(self, chosen: Sequence[int]) -> KernelConfig:
        """The config of value indices of the knobs in walk order."""
        return KernelConfig.for_operation(self.operation, **self._fields(chosen))

    def _branch(self, depth: int, fields: dict[str, Any], first: int | None, memo: dict[tuple, _Branch]) -> _Branch:
        """The configs below the knobs set to `fields` (the first `depth` knobs of the walk),
        `first` the first rule known to refuse them."""
        key = (depth, first, self._key_of[depth](fields))
        found = memo.get(key)
        if found is not None:
            return found
        rules = _rules.CONFIG_RULES
        for at, rule, reason in self._newly_refused(depth, fields):
            if first is None or at < first:
                first = at
                self._examples.setdefault(rule, reason)
        if first is not None and first < self._first_open[depth]:
            branch = _Branch(0, {rules[first][0]: self._below[depth]}, ())
        elif depth == len(self.knobs):
            assert first is None, "every rule is decided at the end of the walk"
            branch = _VALID
        else:
            valid, invalid, nxt = 0, dict[str, int](), []
            for v, value_fields in enumerate(self._value_fields[depth]):
                below = self._branch(depth + 1, {**fields, **value_fields}, first, memo)
                valid += below.valid
                for rule, n in below.invalid.items():
                    invalid[rule] = invalid.get(rule, 0) + n
                if below.valid:
                    nxt.append((v, below))
            branch = _Branch(valid, invalid, tuple(nxt))
        memo[key] = branch
        return branch

    # ---- counting and indexing ------------------------------------------------------------
    def census(self) -> Census:
        """Every config of the product: total, valid, invalid by the first rule that refuses it."""
        root = self._root
        return Census.of(self.total, root.valid, root.invalid, self._examples)

    def __len__(self) -> int:
        return self._root.valid

    @overload
    def __getitem__(self, i: int) -> KernelConfig: ...

    @overload
    def __getitem__(self, i: slice) -> list[KernelConfig]: ...

    def __getitem__(self, i: int | slice) -> KernelConfig | list[KernelConfig]:
        """The i-th valid config (in the walk's order), or a list for a slice. Raises
        IndexError out of range."""
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self._config(self.value_indices(i))

    def value_indices(self, i: int) -> list[int]:
        """The i-th valid config as the index of its value of each knob (`knobs` order)."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"valid config {i} of {n}")
        i %= n
        chosen, branch = [], self._root
        while branch.next:
            for v, below in branch.next:
                if i < below.valid:
                    chosen.append(v)
                    branch = below
                    break
                i -= below.valid
        return chosen

    def all_value_indices(self) -> Iterator[tuple[int, ...]]:
        """Every valid config as `value_indices` gives it, in order, building no config."""
        stack: list[tuple[tuple[int, ...], _Branch]] = [((), self._root)]
        while stack:
            chosen, branch = stack.pop()
            if not branch.next:
                if branch.valid:  # the end of the walk, not a kind refused whole
                    yield chosen
                continue
            stack.extend(((*chosen, v), below) for v, below in reversed(branch.next))

    def graph(self) -> list[list[tuple[tuple[int, int], ...]]]:
        """The valid configs as a layered graph, for building their table in a few array steps
        per knob (`search._features`) instead of a step per config: at each depth (knobs set,
        `knobs` order) one entry per distinct branch, its (value index of the next knob, entry
        at the next depth) pairs in order; the root is entry 0 of depth 0. The paths from the
        root to the last depth are `all_value_indices`, in its order."""
        layers: list[list[tuple[tuple[int, int], ...]]] = []
        frontier = [self._root]
        for _ in self.knobs:
            index: dict[int, int] = {}
            deeper: list[_Branch] = []
            layer = []
            for branch in frontier:
                edges = []
                for v, below in branch.next:
                    at = index.get(id(below))
                    if at is None:
                        at = index[id(below)] = len(deeper)
                        deeper.append(below)
                    edges.append((v, at))
                layer.append(tuple(edges))
            layers.append(layer)
            frontier = deeper
        return layers

    def config_of(self, chosen: Sequence[int]) -> KernelConfig:
        """The config of one entry of `all_value_indices` (or of `value_indices`)."""
        return self._config(chosen)

    def __iter__(self) -> Iterator[KernelConfig]:
        for chosen in self.all_value_indices():
            yield self._config(chosen)

    def __contains__(self, cfg: object) -> bool:
        """Whether `cfg` is one of the valid configs: of this kind, each knob at one of its
        values, and refused by no rule. Builds nothing."""
        if not isinstance(cfg, KernelConfig):
            return False
        if cfg.operation != self.operation:
            return False
        if any(_field_value(knob, cfg) not in values for knob, values in self.knobs):
            return False
        return not _rules.check_config(cfg)

    def values_in_valid(self) -> dict[str, tuple[Any, ...]]:
        """Each knob's values that some valid config holds, in declaration order of the knob
        (a copy of the map kept from the first call: each knob's parameters ask for it)."""
        return dict(self._values_in_valid)

    @functools.cached_property
    def _values_in_valid(self) -> dict[str, tuple[Any, ...]]:
        seen: dict[int, set[int]] = {d: set() for d in range(len(self.knobs))}
        stack, visited = [(0, self._root)], set()
        while stack:
            depth, branch = stack.pop()
            if id(branch) in visited:
                continue
            visited.add(id(branch))
            for v, below in branch.next:
                seen[depth].add(v)
                stack.append((depth + 1, below))
        by_name = {knob.name: tuple(values[v] for v in sorted(seen[d]))
                   for d, (knob, values) in enumerate(self.knobs)}
        return {k.name: by_name[k.name] for k in KernelConfig.knobs}


class AutoConfigs(Sequence[KernelConfig]):
    """The valid configs of several kinds' `AutoKernels`, one after the other."""

    def __init__(self, kinds: Sequence[AutoKernels]):
        self.kinds = tuple(kinds)

    def __len__(self) -> int:
        return sum(len(k) for k in self.kinds)

    @overload
    def __getitem__(self, i: int) -> KernelConfig: ...

    @overload
    def __getitem__(self, i: slice) -> list[KernelConfig]: ...

    def __getitem__(self, i: int | slice) -> KernelConfig | list[KernelConfig]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"valid config {i} of {n}")
        i %= n
        for kind in self.kinds:
            if i < len(kind):
                return kind[i]
            i -= len(kind)
        raise AssertionError("unreachable: i < len(self)")

    def __iter__(self) -> Iterator[KernelConfig]:
        for kind in self.kinds:
            yield from kind

    def __contains__(self, cfg: object) -> bool:
        return any(cfg in kind for kind in self.kinds)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AutoConfigs) and [k.operation for k in self.kinds] == [
            k.operation for k in other.kinds]

    def __hash__(self) -> int:
        return hash(tuple(k.operation for k in self.kinds))
