"""Schema-driven typing of argument values, as vLLM 0.32 types them."""

from __future__ import annotations

from typing import Any

import pytest

from router.parsers.arguments import NO_FIT, ToolSchemas, coerce, conform, parse_json, schema_types

OBJ = {"type": "object", "properties": {"n": {"type": "integer"}}}

# (schema, raw text, expected value)
COERCE_CASES: list[tuple[dict[str, Any], str, Any]] = [
    ({"type": "string"}, " raw \n", " raw \n"),
    ({"type": "integer"}, "-12", -12),
    ({"type": "integer"}, "+5", 5),
    ({"type": "integer"}, " 42 ", 42),
    ({"type": "integer"}, "1e3", 1000.0),  # not an integer: its JSON value
    ({"type": "integer"}, "9" * 5000, "9" * 5000),  # too long for any number: the text
    ({"type": "number"}, "1e3", 1000),
    ({"type": "number"}, "7.5", 7.5),
    ({"type": "number"}, "true", True),
    ({"type": "number"}, "Infinity", "Infinity"),
    ({"type": "boolean"}, "False", False),
    ({"type": "boolean"}, " 1 ", True),
    ({"type": "boolean"}, "2", 2),
    ({"type": "null"}, "NULL", None),
    ({"type": "null"}, "None", "None"),
    ({"type": "object"}, '{"a": NaN}', '{"a": NaN}'),
    ({"type": "object"}, "[1]", [1]),
    (OBJ, '{"n": "5", "x": "5"}', {"n": "5", "x": "5"}),  # not typed inside
    ({"type": "array", "items": OBJ}, '[{"n": "1"}]', [{"n": "1"}]),
    ({"type": ["null", "integer", "string"]}, "null", None),
    ({"type": ["integer", "boolean"]}, "x", "x"),
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "3", 3),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "3", 3),  # a fixed order
    ({"anyOf": [{"anyOf": [{"type": "boolean"}]}, {"type": "array"}]}, "[]", []),
    ({"enum": [1, 2]}, "2", 2),
    ({"const": "x"}, "5", "5"),
    ({"description": "no type"}, "5", "5"),
    ({"type": "mystery"}, "5", 5),
    ({"type": " INT "}, "5", 5),
]


@pytest.mark.parametrize(("schema", "raw", "expected"), COERCE_CASES)
def test_coerce(schema: dict[str, Any], raw: str, expected: Any) -> None:
    value = coerce(raw, schema)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("value", "schema", "expected"),
    [
        ({"n": "2"}, OBJ, {"n": 2}),
        ([{"n": "2"}], {"type": "array", "items": OBJ}, [{"n": 2}]),
        ({"n": "2"}, {"type": "array", "items": OBJ}, {"n": "2"}),
        ("x", {"type": "integer"}, "x"),
        (5, {"type": "string"}, "5"),
        (True, {"type": "string"}, "true"),
        (None, {"type": "string"}, "null"),
        (1, {"type": "boolean"}, True),
        (7.0, {"type": "number"}, 7),
        (3.5, {"type": "integer"}, 3.5),
        ([1], {"type": "string"}, [1]),
    ],
)
def test_conform(value: Any, schema: dict[str, Any], expected: Any) -> None:
    conformed = conform(value, schema)
    assert conformed == expected
    assert type(conformed) is type(expected)


@pytest.mark.parametrize(
    ("schema", "types"),
    [
        ({"type": ["String", "int"]}, {"string", "integer"}),
        ({"type": "object", "enum": [None, True, 1.5]}, {"object", "null", "boolean", "number"}),
        ({"allOf": [{"type": "integer"}], "oneOf": [{"type": "null"}]}, {"integer", "null"}),
        ({}, {"string"}),
        ("not a schema", {"string"}),
    ],
)
def test_schema_types(schema: Any, types: set[str]) -> None:
    assert schema_types(schema) == types


def test_parse_json() -> None:
    assert parse_json('{"a": [1]}') == {"a": [1]}
    assert parse_json("nope") is NO_FIT
    assert parse_json("-Infinity") is NO_FIT
    assert parse_json("1e999") is NO_FIT  # a float's infinity
    assert parse_json('[1, {"a": NaN}]') is NO_FIT


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
