"""Type tool-call argument values by the request's JSON schemas.

Models write string arguments raw and everything else as JSON, so a raw value is
converted by the schema of its key: the first type of the schema (or of a union via a
`type` list, `anyOf` or `oneOf`) that the text converts to wins; objects and arrays are
converted further by their own nested schemas.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

# Returned by `coerce` when the text fits none of the schema's types.
NO_FIT: Any = object()

_INTEGER = re.compile(r"-?\d+")
_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}
_JSON_TYPES: dict[type, str] = {
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    dict: "object",
    list: "array",
    type(None): "null",
}


class ToolSchemas:
    """The request's tools by name, with the parameter schema of each."""

    __slots__ = ("_params",)

    def __init__(self, tools: list[dict[str, Any]] | None) -> None:
        self._params: dict[str, Mapping[str, Any]] = {}
        for tool in tools or ():
            function = tool.get("function") if isinstance(tool, Mapping) else None
            if isinstance(function, Mapping) and isinstance(function.get("name"), str):
                params = function.get("parameters")
                self._params[function["name"]] = params if isinstance(params, Mapping) else {}

    def __bool__(self) -> bool:
        return bool(self._params)

    def __contains__(self, name: object) -> bool:
        return name in self._params

    def property(self, tool: str, key: str) -> Mapping[str, Any] | None:
        """The schema of argument `key` of `tool`, or None if the schema lacks it."""
        props = self._params.get(tool, {}).get("properties")
        if not isinstance(props, Mapping):
            return None
        schema = props.get(key)
        return schema if isinstance(schema, Mapping) else None


def coerce(raw: str, schema: Mapping[str, Any]) -> Any:
    """Convert raw text to the first type of `schema` it fits, or return `NO_FIT`."""
    for option in _options(schema):
        value = _convert(raw, option)
        if value is not NO_FIT:
            return value
    return NO_FIT


def conform(value: Any, schema: Mapping[str, Any]) -> Any:
    """Fit an already-parsed JSON value to `schema`, converting strings inside it.

    Used for nested objects and arrays, and for DeepSeek values written as JSON.
    """
    if isinstance(value, str):
        typed = coerce(value, schema)
        return value if typed is NO_FIT else typed
    for option in _options(schema):
        expected = option.get("type")
        if expected is not None and _JSON_TYPES.get(type(value)) not in _widen(expected):
            continue
        if isinstance(value, dict):
            return _conform_object(value, option)
        if isinstance(value, list):
            return _conform_array(value, option)
        return value
    return value


def _options(schema: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The alternatives of a schema in order, one JSON type each."""
    for union in ("anyOf", "oneOf"):
        branches = schema.get(union)
        if isinstance(branches, list):
            return [
                option
                for branch in branches
                if isinstance(branch, Mapping)
                for option in _options(branch)
            ]
    kind = schema.get("type")
    if isinstance(kind, str):
        return [schema]
    if isinstance(kind, list):
        return [{**schema, "type": t} for t in kind if isinstance(t, str)]
    inferred = _enum_types(schema)
    return [{**schema, "type": t} for t in inferred]


def _enum_types(schema: Mapping[str, Any]) -> list[str]:
    # A schema without "type" may still pin its values through enum/const.
    values = schema.get("enum")
    if not isinstance(values, list):
        values = [schema["const"]] if "const" in schema else []
    kinds: list[str] = []
    for value in values:
        kind = _JSON_TYPES.get(type(value))
        if kind is not None and kind not in kinds:
            kinds.append(kind)
    return kinds


def _widen(expected: str) -> tuple[str, ...]:
    # JSON integers are numbers too.
    return ("integer", "number") if expected == "number" else (expected,)


def _convert(raw: str, option: Mapping[str, Any]) -> Any:
    kind = option.get("type")
    convert = _CONVERTERS.get(kind) if isinstance(kind, str) else None
    return NO_FIT if convert is None else convert(raw, option)


def _to_string(raw: str, _: Mapping[str, Any]) -> Any:
    return raw


def _to_integer(raw: str, _: Mapping[str, Any]) -> Any:
    text = raw.strip()
    if not _INTEGER.fullmatch(text):
        return NO_FIT
    try:
        return int(text)
    except ValueError:  # beyond the interpreter's integer digit limit
        return NO_FIT


def _to_number(raw: str, _: Mapping[str, Any]) -> Any:
    value = parse_json(raw)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return NO_FIT
    return value if isinstance(value, int) or math.isfinite(value) else NO_FIT


def _to_boolean(raw: str, _: Mapping[str, Any]) -> Any:
    return _BOOLEANS.get(raw.strip().lower(), NO_FIT)


def _to_null(raw: str, _: Mapping[str, Any]) -> Any:
    return None if raw.strip() == "null" else NO_FIT


def _to_object(raw: str, option: Mapping[str, Any]) -> Any:
    value = parse_json(raw)
    return _conform_object(value, option) if isinstance(value, dict) else NO_FIT


def _to_array(raw: str, option: Mapping[str, Any]) -> Any:
    value = parse_json(raw)
    return _conform_array(value, option) if isinstance(value, list) else NO_FIT


def _conform_object(value: dict[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    props = schema.get("properties")
    if not isinstance(props, Mapping):
        return value
    return {
        key: conform(item, props[key]) if isinstance(props.get(key), Mapping) else item
        for key, item in value.items()
    }


def _conform_array(value: list[Any], schema: Mapping[str, Any]) -> list[Any]:
    items = schema.get("items")
    if not isinstance(items, Mapping):
        return value
    return [conform(item, items) for item in value]


def parse_json(raw: str) -> Any:
    """JSON value of `raw`, or `NO_FIT` (non-finite numbers are refused)."""
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return NO_FIT


def _reject_constant(name: str) -> Any:
    # NaN and Infinity would make the arguments invalid JSON.
    raise ValueError(name)


_CONVERTERS: dict[str, Callable[[str, Mapping[str, Any]], Any]] = {
    "string": _to_string,
    "integer": _to_integer,
    "number": _to_number,
    "boolean": _to_boolean,
    "null": _to_null,
    "object": _to_object,
    "array": _to_array,
}
