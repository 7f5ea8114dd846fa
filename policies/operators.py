"""The value tests a rules file may write for text features (model, headers, metadata, ...).

A condition is a value, a list of values, or a mapping of operators, ANDed:
`present: true|false`, `prefix: <text>`, `regex: <pattern>` (searched, not anchored).
Numbers and booleans compare as their text, so YAML's `tier: 1` matches `"1"`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import PlainValidator

from policies.conditions import TextMatch, as_text
from policies.types import ENDPOINTS, Endpoint

OPERATORS = ("present", "prefix", "regex")
_SCALARS = (str, int, float, bool)


def parse_text_match(value: Any) -> TextMatch:
    """A text condition: a value, a list of values, or a mapping of operators (ANDed)."""
    if isinstance(value, _SCALARS):
        return TextMatch(values=frozenset({as_text(value) or ""}))
    if isinstance(value, list):
        if not value:
            raise ValueError("an empty list matches nothing")
        if not all(isinstance(item, _SCALARS) for item in value):
            raise ValueError("a list of values must hold only strings, numbers or booleans")
        return TextMatch(values=frozenset(as_text(item) or "" for item in value))
    if isinstance(value, Mapping):
        return _parse_operators(value)
    raise ValueError("expected a value, a list of values or a mapping of operators")


def _parse_operators(spec: Mapping[Any, Any]) -> TextMatch:
    unknown = [str(key) for key in spec if key not in OPERATORS]
    if unknown:
        raise ValueError(
            f"unknown operator {unknown[0]!r} (expected one of {', '.join(OPERATORS)})"
        )
    if not spec:
        raise ValueError(f"no operator given (expected one of {', '.join(OPERATORS)})")
    present, prefix, pattern = spec.get("present"), spec.get("prefix"), spec.get("regex")
    if "present" in spec and not isinstance(present, bool):
        raise ValueError("present: expected true or false")
    for key in ("prefix", "regex"):
        if key in spec and not isinstance(spec[key], str):
            raise ValueError(f"{key}: expected a string")
    if present is False and len(spec) > 1:
        raise ValueError("present: false cannot be combined with other operators")
    try:
        regex = re.compile(pattern) if pattern is not None else None
    except re.error as exc:
        raise ValueError(f"regex: bad pattern {pattern!r}: {exc}") from None
    return TextMatch(present=present, prefix=prefix, regex=regex)


TextSpec = Annotated[TextMatch, PlainValidator(parse_text_match)]


def parse_endpoints(value: Any) -> frozenset[Endpoint]:
    """`endpoint`: one endpoint or a non-empty list of them."""
    items = value if isinstance(value, list) else [value]
    if not items or not all(item in ENDPOINTS for item in items):
        raise ValueError(
            "expected 'chat', 'completions' or 'responses', or a non-empty list of them"
        )
    return frozenset(items)


EndpointSpec = Annotated[frozenset[Endpoint], PlainValidator(parse_endpoints)]
