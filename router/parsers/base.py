"""The output-parser interface: what a parser takes in and what it hands back.

A parser turns the detokenized text of one completion into vLLM's
`reasoning`, `content` and `tool_calls`, both as stream deltas and as the
final message. Every family (GLM, DeepSeek, plain text) implements `OutputParser`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class ToolCallDelta:
    """One streamed piece of a tool call, keyed by the call's position in the message."""

    index: int
    id: str | None = None  # "chatcmpl-tool-<hex>", on the call's first delta only
    name: str | None = None  # on the call's first delta only
    arguments: str = ""  # a fragment; fragments concatenate to the final arguments


@dataclass(slots=True)
class ParsedDelta:
    """What one `feed`/`finish` step decided; empty fields mean nothing new."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


@dataclass(slots=True)
class ToolCall:
    """A complete tool call; `arguments` is JSON text."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class ParsedMessage:
    """The whole message as a non-streaming response reports it."""

    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall]


class OutputParser(Protocol):
    """Incremental parser for one completion's text.

    Call `feed` with each detokenized text delta, `finish` once at the end, then
    `message` for the non-streaming view. The concatenation of everything the
    deltas carry equals `message()` after `finish`, whatever the split of the text.
    """

    def feed(self, text: str) -> ParsedDelta:
        """Consume the next text delta; return what is now decided."""
        ...

    def finish(self) -> ParsedDelta:
        """End of output: flush held-back text and close a truncated tool call."""
        ...

    def message(self) -> ParsedMessage:
        """The message decided so far (the final message once `finish` was called)."""
        ...


def new_tool_call_id() -> str:
    """A fresh OpenAI-style tool call id, as vLLM makes them."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def finish_reason(message: ParsedMessage, ended_by_length: bool, tool_choice: Any) -> str:
    """The OpenAI `finish_reason` for a parsed message.

    `"length"` wins when generation hit `max_tokens`; `"tool_calls"` when the message
    carries calls and `tool_choice` did not name a function; `"stop"` otherwise.
    """
    if ended_by_length:
        return "length"
    if message.tool_calls and not _names_a_function(tool_choice):
        return "tool_calls"
    return "stop"


def _names_a_function(tool_choice: Any) -> bool:
    # Named choice: {"type": "function", "function": {"name": ...}} as a dict or a model.
    if isinstance(tool_choice, Mapping):
        return tool_choice.get("function") is not None
    return getattr(tool_choice, "function", None) is not None
