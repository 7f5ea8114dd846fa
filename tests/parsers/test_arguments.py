"""Schema-driven typing of raw argument text."""

from __future__ import annotations

from typing import Any

import pytest

from router.parsers.arguments import NO_FIT, ToolSchemas, coerce, conform, parse_json

OBJ = {"type": "object", "properties": {"n": {"type": "integer"}}}

# (schema, raw text, expected value or NO_FIT)
COERCE_CASES: list[tuple[dict[str, Any], str, Any]] = [
    ({"type": "string"}, " raw \n", " raw \n"),
    ({"type": "integer"}, "-12", -12),
    ({"type": "integer"}, "1e3", NO_FIT),
    ({"type": "integer"}, "9" * 5000, NO_FIT),
    ({"type": "number"}, "1e3", 1000.0),
    ({"type": "number"}, "true", NO_FIT),
    ({"type": "number"}, "Infinity", NO_FIT),
    ({"type": "boolean"}, "False", False),
    ({"type": "boolean"}, "1", True),
    ({"type": "boolean"}, "2", NO_FIT),
    ({"type": "null"}, " null ", None),
    ({"type": "null"}, "NULL", NO_FIT),
    ({"type": "object"}, '{"a": NaN}', NO_FIT),
    (OBJ, '{"n": "5", "x": "5"}', {"n": 5, "x": "5"}),
    ({"type": "array", "items": OBJ}, '[{"n": "1"}]', [{"n": 1}]),
    ({"type": ["null", "integer", "string"]}, "null", None),
    ({"type": ["integer", "boolean"]}, "x", NO_FIT),
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "3", 3),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "3", "3"),
    ({"anyOf": [{"anyOf": [{"type": "boolean"}]}, {"type": "array"}]}, "[]", []),
    ({"enum": [1, 2]}, "2", 2),
    ({"const": "x"}, "x", "x"),
    ({"description": "no type"}, "5", NO_FIT),
    ({"type": "mystery"}, "5", NO_FIT),
]


@pytest.mark.parametrize(("schema", "raw", "expected"), COERCE_CASES)
def test_coerce(schema: dict[str, Any], raw: str, expected: Any) -> None:
    value = coerce(raw, schema)
    if expected is NO_FIT:
        assert value is NO_FIT
    else:
        assert value == expected
        assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("value", "schema", "expected"),
    [
        ({"n": "2"}, OBJ, {"n": 2}),
        ([{"n": "2"}], {"type": "array", "items": OBJ}, [{"n": 2}]),
        (5, {"type": "string"}, 5),
        ({"n": "2"}, {"type": "array", "items": OBJ}, {"n": "2"}),
        ("x", {"type": "integer"}, "x"),
    ],
)
def test_conform(value: Any, schema: dict[str, Any], expected: Any) -> None:
    assert conform(value, schema) == expected


def test_parse_json() -> None:
    assert parse_json('{"a": [1]}') == {"a": [1]}
    assert parse_json("nope") is NO_FIT
    assert parse_json("-Infinity") is NO_FIT


def test_tool_schemas() -> None:
    schemas = ToolSchemas(
        [
            {"type": "function", "function": {"name": "f", "parameters": OBJ}},
            {"type": "function", "function": {"name": "g"}},
            {"type": "function"},
            "junk",  # type: ignore[list-item]
        ]
    )
    assert "f" in schemas and "g" in schemas and "h" not in schemas
    assert schemas.property("f", "n") == {"type": "integer"}
    assert schemas.property("f", "zz") is None
    assert schemas.property("g", "n") is None
    assert not ToolSchemas(None) and not ToolSchemas([])
