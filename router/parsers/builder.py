"""Assemble a parsed message piece by piece and hand out what each step decided.

The family parsers only recognise structure; this builder owns the output rules they
share: which content whitespace survives, how a call's `arguments` JSON is written as
append-only fragments, and how a truncated call is closed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from router.parsers.arguments import ToolSchemas
from router.parsers.base import (
    ParsedDelta,
    ParsedMessage,
    ToolCall,
    ToolCallDelta,
    new_tool_call_id,
)


class MessageBuilder:
    """Accumulates reasoning, content and tool calls for one completion.

    Content whitespace, as vLLM's parsers leave it: leading whitespace is held until the
    first other character (then kept) or a tool call (then dropped); whitespace-only
    content is kept at the end. With `strip_before_calls`, trailing whitespace is held
    until more content shows it was inner, or dropped when a tool call starts; at the
    end it is kept. With `strip_reasoning`, trailing reasoning whitespace is held until
    more reasoning follows, and dropped otherwise. With `known_tools_only`, a call to a
    tool the request did not declare is dropped; otherwise any named call is kept.
    """

    __slots__ = (
        "_call",
        "_calls",
        "_content",
        "_content_closed",
        "_content_started",
        "_delta_calls",
        "_delta_content",
        "_delta_reasoning",
        "_held_reasoning_space",
        "_held_space",
        "_known_tools_only",
        "_new_id",
        "_reasoning",
        "_strip_before_calls",
        "_strip_reasoning",
        "tools",
    )

    def __init__(
        self,
        tools: ToolSchemas,
        *,
        strip_before_calls: bool,
        strip_reasoning: bool,
        known_tools_only: bool,
        new_id: Callable[[], str] = new_tool_call_id,
    ) -> None:
        self.tools = tools
        self._strip_before_calls = strip_before_calls
        self._strip_reasoning = strip_reasoning
        self._known_tools_only = known_tools_only
        self._new_id = new_id
        # The whole message so far.
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._calls: list[ToolCall] = []
        # Whitespace not yet decided, and where content stands.
        self._held_reasoning_space = ""
        self._held_space: list[str] = []
        self._content_started = False
        self._content_closed = False
        # The call being written: (tool call, argument keys seen), or None.
        self._call: tuple[ToolCall, set[str]] | None = None
        # What the current step decided.
        self._delta_reasoning: list[str] = []
        self._delta_content: list[str] = []
        self._delta_calls: list[ToolCallDelta] = []

    def reasoning(self, text: str) -> None:
        """Append reasoning text (its trailing whitespace held if `strip_reasoning`)."""
        if self._strip_reasoning:
            body = text.rstrip()
            if not body:
                self._held_reasoning_space += text
                return
            text, self._held_reasoning_space = (
                self._held_reasoning_space + body,
                text[len(body) :],
            )
        if text:
            self._reasoning.append(text)
            self._delta_reasoning.append(text)

    def content(self, text: str) -> None:
        """Append content text, holding back whitespace that may yet be stripped."""
        if not text or self._content_closed:
            return
        if not self._content_started:
            if text.isspace():
                self._held_space.append(text)
                return
            self._content_started = True
        if self._strip_before_calls:
            body = text.rstrip()
            if not body:
                self._held_space.append(text)
                return
            self._emit_content(body)
            self._held_space.append(text[len(body) :])
        else:
            self._emit_content(text)

    def _emit_content(self, text: str) -> None:
        if self._held_space:
            text = "".join(self._held_space) + text
            self._held_space.clear()
        if not text:
            return
        self._content.append(text)
        self._delta_content.append(text)

    def close_content(self) -> None:
        """Tool calls begin: no more content; held whitespace is settled."""
        self._held_space.clear()
        self._content_closed = True

    @property
    def current_tool(self) -> str | None:
        """Name of the call being written, if any."""
        return self._call[0].name if self._call else None

    @property
    def has_arguments(self) -> bool:
        """Whether the call being written has an argument yet."""
        return bool(self._call and self._call[1])

    def open_call(self, name: str) -> bool:
        """Start a call to `name`; a nameless call, or (with `known_tools_only`) one to a
        tool the request did not declare, is dropped."""
        self.close_call()
        if not name or (self._known_tools_only and name not in self.tools):
            return False
        call = ToolCall(id=self._new_id(), name=name, arguments="")
        self._call = (call, set())
        self._delta_calls.append(ToolCallDelta(index=len(self._calls), id=call.id, name=name))
        return True

    def argument(self, key: str, value: Any) -> None:
        """Add one complete argument to the open call (a repeated key keeps its first value)."""
        if self._call is None:
            return
        call, keys = self._call
        if key in keys:
            return
        opener = ", " if keys else "{"
        keys.add(key)
        pair = f"{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}"
        self._append_arguments(call, opener + pair)

    def close_call(self) -> None:
        """Close the open call, keeping the arguments completed so far."""
        if self._call is None:
            return
        call, keys = self._call
        self._append_arguments(call, "}" if keys else "{}")
        self._calls.append(call)
        self._call = None

    def _append_arguments(self, call: ToolCall, fragment: str) -> None:
        call.arguments += fragment
        index = len(self._calls)
        last = self._delta_calls[-1] if self._delta_calls else None
        if last is not None and last.index == index:
            last.arguments += fragment
        else:
            self._delta_calls.append(ToolCallDelta(index=index, arguments=fragment))

    def finish(self) -> None:
        """End of output: keep held content whitespace, close a cut-off call."""
        self.close_call()
        if not self._content_closed:
            self._emit_content("")
        self._held_space.clear()
        self._content_closed = True

    def take(self) -> ParsedDelta:
        """What was decided since the last `take`."""
        delta = ParsedDelta(
            reasoning="".join(self._delta_reasoning),
            content="".join(self._delta_content),
            tool_calls=self._delta_calls,
        )
        self._delta_reasoning.clear()
        self._delta_content.clear()
        self._delta_calls = []
        return delta

    def message(self) -> ParsedMessage:
        """The message so far; a call still open is not included."""
        return ParsedMessage(
            reasoning="".join(self._reasoning) or None,
            content="".join(self._content) or None,
            tool_calls=list(self._calls),
        )
