"""Shared tools and helpers for the output-parser tests."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from router.parsers import (
    OutputParser,
    ParsedDelta,
    ParsedMessage,
    ToolCall,
    make_output_parser,
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "location": {"type": "string"},
                    "days": {"type": "integer"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "filters": {
                        "type": "object",
                        "properties": {
                            "max": {"type": "integer"},
                            "tags": {"type": "array", "items": {"type": "string"}},
                        },
                    },
                    "strict": {"type": "boolean"},
                    "safe": {"type": "boolean"},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "get_current_date", "parameters": {}}},
    {
        "type": "function",
        "function": {
            "name": "typed",
            "parameters": {
                "type": "object",
                "properties": {
                    "s": {"type": "string"},
                    "i": {"type": "integer"},
                    "n": {"type": "number"},
                    "b": {"type": "boolean"},
                    "z": {"type": "null"},
                    "o": {"type": "object"},
                    "a": {"type": "array"},
                    "u": {"type": ["integer", "string"]},
                    "any": {"anyOf": [{"type": "null"}, {"type": "number"}]},
                    "one": {"oneOf": [{"type": "boolean"}, {"type": "string"}]},
                    "nested": {
                        "type": "object",
                        "properties": {
                            "count": {"type": "integer"},
                            "inner": {
                                "type": "object",
                                "properties": {"flag": {"type": "boolean"}},
                            },
                        },
                    },
                    "ints": {"type": "array", "items": {"type": "integer"}},
                },
            },
        },
    },
]


def run(parser: OutputParser, chunks: Iterable[str]) -> tuple[ParsedMessage, list[ParsedDelta]]:
    """Feed every chunk, finish, and return the final message and all deltas."""
    deltas = [parser.feed(chunk) for chunk in chunks]
    deltas.append(parser.finish())
    return parser.message(), deltas


def parse(
    name: str,
    chunks: Iterable[str],
    *,
    tools: list[dict[str, Any]] | None = TOOLS,
    kwargs: dict[str, Any] | None = None,
) -> tuple[ParsedMessage, list[ParsedDelta]]:
    """Run a fresh parser of family `name` over `chunks`."""
    return run(make_output_parser(name, tools=tools, chat_template_kwargs=kwargs), chunks)


def streamed(deltas: list[ParsedDelta]) -> ParsedMessage:
    """Rebuild the message a streaming client sees from the deltas.

    Also checks the delta rules: each call announces id and name once, first, with
    indexes in order; later fragments carry neither.
    """
    calls: list[dict[str, str]] = []
    for delta in deltas:
        for piece in delta.tool_calls:
            if piece.index == len(calls):
                assert piece.id is not None and piece.id.startswith("chatcmpl-tool-")
                assert piece.name
                calls.append({"id": piece.id, "name": piece.name, "arguments": ""})
            else:
                assert piece.index == len(calls) - 1, "fragments belong to the newest call"
                assert piece.id is None and piece.name is None
            calls[piece.index]["arguments"] += piece.arguments
    reasoning = "".join(d.reasoning for d in deltas)
    content = "".join(d.content for d in deltas)
    return ParsedMessage(
        reasoning=reasoning or None,
        content=content or None,
        tool_calls=[ToolCall(**call) for call in calls],
    )


def without_ids(message: ParsedMessage) -> tuple[str | None, str | None, list[tuple[str, str]]]:
    """The message with tool-call ids left out, for comparing separate runs."""
    return (
        message.reasoning,
        message.content,
        [(call.name, call.arguments) for call in message.tool_calls],
    )
