"""How one value of a knob is written: in a space file, where a pydantic type parses and
checks it, and as an Optuna choice, where it is one string. Each knob of space/_knobs.py has
one of these kinds.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Strict

Rule = Callable[[Any], str | None]
"""A per-value rule of space/_rules.py: the problem with a value, or None."""

Int = Annotated[int, Strict()]
"""An integer written as one in a space file: not a string, float or bool."""


def checked(rule: Rule) -> Callable[[Any], Any]:
    """`rule` as a pydantic validator: the value, or ValueError with its problem."""
    def check(v: Any) -> Any:
        problem = rule(v)
        if problem:
            raise ValueError(problem)
        return v
    return check


def _one_of(words: list[str]) -> str:
    return f"{', '.join(words[:-1])} or {words[-1]}"


class Kind:
    """How one value of a knob is written: in a space file (`annotation`, a pydantic type that
    parses and checks it) and as an Optuna choice (`text`, and back with `read`). `rule`
    checks each field's value in a config (`space.check_config`)."""

    rule: Rule | None

    def annotation(self, name: str) -> Any:
        raise NotImplementedError

    def as_list(self, v: Any) -> Any:
        """A space file's value for the knob as the list of its values."""
        return v if isinstance(v, list) else [v]

    def text(self, v: Any) -> str:
        raise NotImplementedError

    def read(self, text: str) -> Any:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Number(Kind):
    """A whole number, written as one."""

    rule: Rule

    def annotation(self, name: str) -> Any:
        return Annotated[Int, AfterValidator(checked(self.rule))]

    def text(self, v: int) -> str:
        return str(v)

    def read(self, text: str) -> int:
        return int(text)


@dataclasses.dataclass(frozen=True)
class NumberOrAuto(Kind):
    """A whole number, or `auto`, which the config holds as `auto` (0)."""

    rule: Rule
    wanted: str
    """What a space file must give, after "auto or", for its error line."""
    auto: int = 0

    def annotation(self, name: str) -> Any:
        def parse(v: Any) -> Any:
            if v == "auto":
                return self.auto
            if v == self.auto or not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"{name} must be auto or {self.wanted}")
            return v
        return Annotated[Int, BeforeValidator(parse), AfterValidator(checked(self.rule))]

    def text(self, v: int) -> str:
        return "auto" if v == self.auto else str(v)

    def read(self, text: str) -> int:
        return self.auto if text == "auto" else int(text)


@dataclasses.dataclass(frozen=True)
class Flag(Kind):
    """true or false."""

    rule: Rule

    def annotation(self, name: str) -> Any:
        # Checked before pydantic, which would take "true" or 1 for true.
        return Annotated[bool, BeforeValidator(checked(self.rule))]

    def text(self, v: bool) -> str:
        return "true" if v else "false"

    def read(self, text: str) -> bool:
        return text == "true"


def spelling(member: enum.Enum) -> str:
    """How files, tables and studies write an enum member: a text enum's value, a numbered
    enum's name in lower case."""
    return member.value if isinstance(member, str) else member.name.lower()


def member(cls: type[enum.Enum], spelled: str) -> Any:
    """The member of `cls` that `spelling` writes as `spelled`."""
    return cls(spelled) if issubclass(cls, str) else cls[spelled.upper()]


@dataclasses.dataclass(frozen=True)
class Choice(Kind):
    """A member of an enum, by its `spelling`; with `auto`, also the word auto (which the
    knob's `auto` resolves)."""

    enum: type[enum.Enum]
    auto: bool = False
    rule: Rule | None = dataclasses.field(default=None, init=False)

    def annotation(self, name: str) -> Any:
        if issubclass(self.enum, str) and not self.auto:
            return self.enum  # pydantic's error lists the values
        words = (["auto"] if self.auto else []) + [spelling(m) for m in self.enum]

        def parse(v: Any) -> Any:
            if isinstance(v, str) and v in words:
                return v if v == "auto" else member(self.enum, v)
            raise ValueError(f"{name} must be {_one_of(words)}")
        one = Literal["auto"] | self.enum if self.auto else self.enum
        return Annotated[one, BeforeValidator(parse)]

    def text(self, v: Any) -> str:
        return v if v == "auto" else spelling(v)

    def read(self, text: str) -> Any:
        return text if self.auto and text == "auto" else member(self.enum, text)


_PAIR = re.compile(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", re.ASCII)


@dataclasses.dataclass(frozen=True)
class Cluster(Kind):
    """A cluster shape: two whole numbers, written MxN or [M, N], each checked by `rule`, their
    product at most `most` CTAs."""

    rule: Rule
    most: int

    def parse(self, v: Any) -> tuple[int, int]:
        if isinstance(v, str) and (match := _PAIR.fullmatch(v)):
            v = [int(match[1]), int(match[2])]
        if not (isinstance(v, list) and len(v) == 2):
            raise ValueError("cluster must be written MxN (e.g. 2x1) or [M, N]")
        checked(self.rule)(v[0])
        checked(self.rule)(v[1])
        if v[0] * v[1] > self.most:
            raise ValueError(f"a cluster holds at most {self.most} CTAs")
        return (v[0], v[1])

    def annotation(self, name: str) -> Any:
        return Annotated[tuple[Int, Int], BeforeValidator(self.parse)]

    def as_list(self, v: Any) -> Any:
        # [2, 1] is one value, not a list of two.
        if isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v):
            return [v]
        return super().as_list(v)

    def text(self, v: tuple[int, int]) -> str:
        return f"{v[0]}x{v[1]}"

    def read(self, text: str) -> tuple[int, int]:
        return self.parse(text)
