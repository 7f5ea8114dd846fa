"""The compiled match conditions of a rule, evaluated against request features.

Every condition but `PromptTokens` is decided by the cheap features alone. `PromptTokens`
is three-valued: given only bounds on the token count it may answer None (undecided),
which is how the matcher knows whether the count is needed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from policies.capabilities import TokenRange
from policies.features import RequestFeatures


def as_text(value: Any) -> str | None:
    """The text a scalar compares as: YAML's `true`, `1` and `"1"` match a client's `"true"`,
    `1` and `"1"` respectively in both directions."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, sort_keys=True, default=str)


@dataclass(frozen=True, slots=True)
class TextMatch:
    """A test on an optional text value: one of `values`, and/or the operators (ANDed).

    `present: false` matches only an absent value; every other test needs a value.
    `regex` is searched (anchor it with `^…$` to match the whole value).
    """

    values: frozenset[str] | None = None
    present: bool | None = None
    prefix: str | None = None
    regex: re.Pattern[str] | None = None

    def matches(self, value: str | None) -> bool:
        if value is None:
            return self.present is False
        if self.present is False:
            return False
        if self.values is not None and value not in self.values:
            return False
        if self.prefix is not None and not value.startswith(self.prefix):
            return False
        return self.regex is None or self.regex.search(value) is not None

    def describe(self) -> str:
        parts = []
        if self.values is not None:
            shown = sorted(self.values)
            parts.append(f"is {shown[0]!r}" if len(shown) == 1 else f"in {shown!r}")
        if self.present is not None:
            parts.append("present" if self.present else "absent")
        if self.prefix is not None:
            parts.append(f"starts with {self.prefix!r}")
        if self.regex is not None:
            parts.append(f"matches /{self.regex.pattern}/")
        return " and ".join(parts)


@dataclass(frozen=True, slots=True)
class IntRange:
    """An inclusive range; either end may be open."""

    min: int | None = None
    max: int | None = None

    def contains(self, value: int) -> bool:
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)

    def describe(self) -> str:
        if self.max is None:
            return f">= {self.min}"
        if self.min is None:
            return f"<= {self.max}"
        return f"in [{self.min}, {self.max}]"


class Condition(Protocol):
    """One ANDed clause of a rule's `match`."""

    @property
    def label(self) -> str:
        """Where it comes from in the rules file, e.g. `headers.x-workload`."""
        ...

    def test(self, features: RequestFeatures, tokens: TokenRange) -> bool | None:
        """True or False when decided; None only when the token count would decide."""
        ...

    def describe(self) -> str:
        """The requirement, for explanations."""
        ...

    def observe(self, features: RequestFeatures, tokens: TokenRange) -> str:
        """The request's value, for explanations."""
        ...


@dataclass(frozen=True, slots=True)
class TextCondition:
    """A `TextMatch` on one text feature: model, API-key name, user, a header, a metadata field."""

    label: str
    read: Callable[[RequestFeatures], str | None]
    match: TextMatch

    def test(self, features: RequestFeatures, tokens: TokenRange) -> bool:
        return self.match.matches(self.read(features))

    def describe(self) -> str:
        return self.match.describe()

    def observe(self, features: RequestFeatures, tokens: TokenRange) -> str:
        value = self.read(features)
        return "absent" if value is None else repr(value)


def read_header(name: str) -> Callable[[RequestFeatures], str | None]:
    return lambda features: features.headers.get(name)


def read_metadata(key: str) -> Callable[[RequestFeatures], str | None]:
    return lambda features: as_text(features.metadata.get(key))


@dataclass(frozen=True, slots=True)
class EndpointCondition:
    label: str
    endpoints: frozenset[str]

    def test(self, features: RequestFeatures, tokens: TokenRange) -> bool:
        return features.endpoint in self.endpoints

    def describe(self) -> str:
        return f"in {sorted(self.endpoints)!r}"

    def observe(self, features: RequestFeatures, tokens: TokenRange) -> str:
        return repr(features.endpoint)


@dataclass(frozen=True, slots=True)
class FlagCondition:
    """`stream` or `tools`: a boolean feature equals the rule's value."""

    label: str
    read: Callable[[RequestFeatures], bool]
    expected: bool

    def test(self, features: RequestFeatures, tokens: TokenRange) -> bool:
        return self.read(features) is self.expected

    def describe(self) -> str:
        return f"is {str(self.expected).lower()}"

    def observe(self, features: RequestFeatures, tokens: TokenRange) -> str:
        return str(self.read(features)).lower()


@dataclass(frozen=True, slots=True)
class MaxTokensCondition:
    """A range on the completion budget. An unset budget lets the server generate up to
    the context limit, so it counts as unbounded: it satisfies `min` but never `max`."""

    label: str
    range: IntRange

    def test(self, features: RequestFeatures, tokens: TokenRange) -> bool:
        if features.max_tokens is None:
            return self.range.max is None
        return self.range.contains(features.max_tokens)

    def describe(self) -> str:
        return self.range.describe()

    def observe(self, features: RequestFeatures, tokens: TokenRange) -> str:
        return "unset" if features.max_tokens is None else str(features.max_tokens)


@dataclass(frozen=True, slots=True)
class PromptTokens:
    """A range on the prompt's token count, decided from bounds when they suffice."""

    label: str
    range: IntRange

    def test(self, features: RequestFeatures, tokens: TokenRange) -> bool | None:
        low, high = tokens.low, tokens.high
        lo_ok = self.range.min is None or low >= self.range.min
        hi_ok = self.range.max is None or (high is not None and high <= self.range.max)
        if lo_ok and hi_ok:
            return True
        if (self.range.max is not None and low > self.range.max) or (
            self.range.min is not None and high is not None and high < self.range.min
        ):
            return False
        return None

    def describe(self) -> str:
        return self.range.describe()

    def observe(self, features: RequestFeatures, tokens: TokenRange) -> str:
        if tokens.exact:
            return str(tokens.low)
        high = "unbounded" if tokens.high is None else str(tokens.high)
        return f"not counted, between {tokens.low} and {high}"
