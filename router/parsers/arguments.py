"""Type tool-call argument values by the request's JSON schemas, as vLLM 0.32 does.

Models write string arguments raw and most others as JSON, so a value is typed by the
schema of its key. The schema's types (its `type`, types inferred from `enum`, and those
of `anyOf`/`oneOf`/`allOf` branches) are tried in a fixed order, whatever order the
schema lists them in: null, integer, number, boolean, object, array, string. Text that
fits none of them is taken as JSON if it is JSON, else as it is. `coerce` types text
(GLM's values); `conform` re-types a value already parsed (DeepSeek's), going into
objects and arrays by their `properties` and `items`. No result is ever a non-finite
number: those would make the arguments invalid JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

# Returned by `parse_json` for text that is not (finite) JSON.
NO_FIT: Any = object()

_ORDER = ("null", "integer", "number", "boolean", "object", "array", "string")
_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}
# Type names some tool schemas use for the JSON Schema ones (vLLM reads them alike).
_ALIASES = {
    "str": "string",
    "text": "string",
    "varchar": "string",
    "char": "string",
    "enum": "string",
    "int": "integer",
    "int32": "integer",
    "int64": "integer",
    "uint": "integer",
    "uint32": "integer",
    "uint64": "integer",
    "long": "integer",
    "short": "integer",
    "unsigned": "integer",
    "float": "number",
    "float32": "number",
    "float64": "number",
    "double": "number",
    "bool": "boolean",
    "dict": "object",
    "arr": "array",
    "list": "array",
    "sequence": "array",
}
_ENUM_TYPES: dict[type, str] = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
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

    def properties(self, tool: str) -> Mapping[str, Any]:
        """The argument schemas of `tool` by key (empty when it declares none)."""
        props = self._params.get(tool, {}).get("properties")
        return props if isinstance(props, Mapping) else {}

    def property(self, tool: str, key: str) -> Mapping[str, Any] | None:
        """The schema of argument `key` of `tool`, or None if the schema lacks it."""
        schema = self.properties(tool).get(key)
        return schema if isinstance(schema, Mapping) else None


def coerce(raw: str, schema: Mapping[str, Any]) -> Any:
    """The value of argument text `raw` under `schema` (see the module docstring)."""
    return _coerce_text(raw, schema_types(schema))


def conform(value: Any, schema: Mapping[str, Any]) -> Any:
    """Re-type a parsed JSON value by `schema`: text is typed as by `coerce`, objects and
    arrays are gone into, and a number, boolean or null becomes what its JSON text types
    as (`1` under a boolean schema is `true`, `true` under a string schema is `"true"`)."""
    if isinstance(value, str):
        return coerce(value, schema)
    if isinstance(value, dict):
        props = schema.get("properties")
        if not isinstance(props, Mapping):
            return value
        return {
            key: conform(item, props[key]) if isinstance(props.get(key), Mapping) else item
            for key, item in value.items()
        }
    if isinstance(value, list):
        items = schema.get("items")
        return [conform(item, items) for item in value] if isinstance(items, Mapping) else value
    typed = coerce(json.dumps(value), schema)
    return typed if type(typed) is not type(value) or typed != value else value


def schema_types(schema: Any) -> frozenset[str]:
    """The JSON types a schema allows; `string` when it says nothing about types."""
    if not isinstance(schema, Mapping):
        return frozenset({"string"})
    found: set[str] = set()
    kind = schema.get("type")
    if isinstance(kind, str):
        found.add(kind)
    elif isinstance(kind, list):
        found.update(t for t in kind if isinstance(t, str))
    values = schema.get("enum")
    if isinstance(values, list):
        found.update(_ENUM_TYPES[type(v)] for v in values if type(v) in _ENUM_TYPES)
    for union in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(union)
        if isinstance(branches, list):
            for branch in branches:
                found |= schema_types(branch)
    if not found:
        return frozenset({"string"})
    return frozenset(_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in found)


def _coerce_text(raw: str, types: frozenset[str]) -> Any:
    for kind in _ORDER:
        if kind not in types:
            continue
        if kind == "string":
            return raw
        value = _CONVERTERS[kind](raw)
        if value is not NO_FIT:
            return value
    value = parse_json(raw)
    return raw if value is NO_FIT else value


def _to_null(raw: str) -> Any:
    return None if raw.lower() == "null" else NO_FIT


def _to_integer(raw: str) -> Any:
    try:
        return int(raw)  # Python's own reading: signs, spaces, `_` separators
    except ValueError:
        return NO_FIT


def _to_number(raw: str) -> Any:
    try:
        value = float(raw)
    except ValueError:
        return NO_FIT
    if not math.isfinite(value):
        return NO_FIT
    return int(value) if value == int(value) else value


def _to_boolean(raw: str) -> Any:
    return _BOOLEANS.get(raw.strip().lower(), NO_FIT)


def _to_json(raw: str) -> Any:
    # `object` and `array` alike take any JSON value, as vLLM's do.
    return parse_json(raw)


_CONVERTERS = {
    "null": _to_null,
    "integer": _to_integer,
    "number": _to_number,
    "boolean": _to_boolean,
    "object": _to_json,
    "array": _to_json,
}


def parse_json(raw: str) -> Any:
    """JSON value of `raw`, or `NO_FIT` (also for NaN, infinities and numbers too large
    for a float, anywhere in the value)."""
    try:
        value = json.loads(raw)
        json.dumps(value, allow_nan=False)
    except (ValueError, RecursionError):
        return NO_FIT
    return value
