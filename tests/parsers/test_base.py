"""The parser interface: factory, finish_reason, deltas, and the plain-text parser."""

from __future__ import annotations

from typing import Any

import pytest

from router.parsers import (
    OUTPUT_PARSERS,
    ParsedDelta,
    ParsedMessage,
    ToolCall,
    ToolCallDelta,
    finish_reason,
    make_output_parser,
    needs_special_tokens,
)

from .support import TOOLS, parse, streamed

WITH_CALL = ParsedMessage(None, None, [ToolCall("chatcmpl-tool-1", "f", "{}")])
WITHOUT_CALL = ParsedMessage(None, "hi", [])
NAMED = {"type": "function", "function": {"name": "f"}}


class _NamedChoice:
    """A pydantic-like named tool choice."""

    def __init__(self) -> None:
        self.function = {"name": "f"}


@pytest.mark.parametrize(
    ("message", "by_length", "tool_choice", "expected"),
    [
        (WITH_CALL, False, "auto", "tool_calls"),
        (WITH_CALL, False, None, "tool_calls"),
        (WITH_CALL, False, "required", "tool_calls"),
        (WITH_CALL, True, "auto", "length"),
        (WITH_CALL, False, NAMED, "stop"),
        (WITH_CALL, False, _NamedChoice(), "stop"),
        (WITHOUT_CALL, False, "auto", "stop"),
        (WITHOUT_CALL, True, "auto", "length"),
    ],
)
def test_finish_reason(message: ParsedMessage, by_length: bool, tool_choice: Any, expected: str):
    assert finish_reason(message, by_length, tool_choice) == expected


def test_names() -> None:
    assert set(OUTPUT_PARSERS) == {"none", "glm45", "glm47", "deepseek_v32"}
    with pytest.raises(ValueError, match="unknown output parser"):
        make_output_parser("qwen3", tools=None, chat_template_kwargs=None)
    with pytest.raises(ValueError):
        needs_special_tokens("qwen3")
    assert not needs_special_tokens("none")
    assert all(needs_special_tokens(n) for n in set(OUTPUT_PARSERS) - {"none"})


def test_parsed_delta_truthiness() -> None:
    assert not ParsedDelta()
    assert ParsedDelta(reasoning="r") and ParsedDelta(content="c")
    assert ParsedDelta(tool_calls=[ToolCallDelta(index=0)])


@pytest.mark.parametrize("name", sorted(OUTPUT_PARSERS))
def test_every_parser_handles_plain_text(name: str) -> None:
    kwargs = {"enable_thinking": False}
    message, deltas = parse(name, ["Hello", ", ", "world"], kwargs=kwargs)
    assert (message.reasoning, message.content, message.tool_calls) == (None, "Hello, world", [])
    assert streamed(deltas) == message


@pytest.mark.parametrize("name", sorted(OUTPUT_PARSERS))
def test_every_parser_handles_empty_output(name: str) -> None:
    message, deltas = parse(name, [])
    assert message == ParsedMessage(None, None, [])
    assert not any(deltas)


def test_none_parser_keeps_markup() -> None:
    text = "<think>x</think><tool_call>get_current_date</tool_call>"
    message, _ = parse("none", list(text), tools=TOOLS)
    assert message == ParsedMessage(None, text, [])
