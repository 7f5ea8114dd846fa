"""GLM-4.5/4.6 (`glm45`) and GLM-4.7/5/5.1 (`glm47`) reasoning and tool-call parser.

Reasoning sits in `<think>…</think>`; each tool call is `<tool_call>NAME` followed by
`<arg_key>K</arg_key><arg_value>V</arg_value>` pairs and `</tool_call>`. Values are
typed by the tool's JSON schema. See docs/output-formats.md §1.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from types import MappingProxyType
from typing import Any

from router.parsers.arguments import NO_FIT, ToolSchemas, coerce
from router.parsers.builder import MessageBuilder
from router.parsers.machine import MarkupParser
from router.parsers.scanner import Markers

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
KEY_OPEN = "<arg_key>"
KEY_CLOSE = "</arg_key>"
VALUE_OPEN = "<arg_value>"
VALUE_CLOSE = "</arg_value>"


class _State(IntEnum):
    LEADING = 0  # only whitespace so far; a `<think>` may still open reasoning
    REASONING = 1
    CONTENT = 2
    NAME = 3  # after <tool_call>, reading the name
    ARGS = 4  # inside a call, between pairs
    KEY = 5
    AFTER_KEY = 6
    VALUE = 7
    BETWEEN = 8  # after a call; only another call matters


def _table(tools: bool) -> Mapping[_State, Markers]:
    call = (CALL_OPEN,) if tools else ()
    return MappingProxyType(
        {
            _State.LEADING: Markers((THINK_OPEN, THINK_CLOSE, *call)),
            _State.REASONING: Markers((THINK_CLOSE, *call)),
            _State.CONTENT: Markers(call),
            _State.NAME: Markers((KEY_OPEN, CALL_CLOSE)),
            _State.ARGS: Markers((KEY_OPEN, CALL_CLOSE)),
            _State.KEY: Markers((KEY_CLOSE, CALL_CLOSE)),
            _State.AFTER_KEY: Markers((VALUE_OPEN, KEY_OPEN, CALL_CLOSE)),
            _State.VALUE: Markers((VALUE_CLOSE,)),
            _State.BETWEEN: Markers((CALL_OPEN,)),
        }
    )


_WITH_TOOLS = _table(tools=True)
_WITHOUT_TOOLS = _table(tools=False)


class GlmParser(MarkupParser):
    """Incremental parser for GLM output.

    `variant` is "glm45" (the model writes `<think>` itself) or "glm47" (the prompt
    already opened reasoning; a stray leading `<think>` is absorbed). With `thinking`
    off the output is content from the start. Without tools, tool-call markup is
    plain content, as when vLLM runs no tool parser.
    """

    __slots__ = ("_key", "_leading", "_leading_to_reasoning", "_parts", "_state", "_table")

    def __init__(self, variant: str, *, tools: ToolSchemas, thinking: bool) -> None:
        if variant not in ("glm45", "glm47"):
            raise ValueError(f"unknown GLM variant {variant!r}")
        super().__init__(MessageBuilder(tools, strip_leading=True, strip_before_calls=True))
        self._table = _WITH_TOOLS if tools else _WITHOUT_TOOLS
        self._state = _State.LEADING if thinking else _State.CONTENT
        # Where leading text goes once it is not whitespace before `<think>`.
        self._leading_to_reasoning = variant == "glm47"
        self._leading: list[str] = []  # whitespace seen in LEADING
        self._parts: list[str] = []  # the name, key or value being read
        self._key = ""

    def _markers(self) -> Markers:
        return self._table[self._state]

    def _on_text(self, text: str) -> None:
        state = self._state
        if state == _State.REASONING:
            self._out.reasoning(text)
        elif state == _State.CONTENT:
            self._out.content(text)
        elif state in (_State.NAME, _State.KEY, _State.VALUE):
            self._parts.append(text)
        elif state == _State.LEADING:
            self._leading.append(text)
            if not text.isspace():
                self._leave_leading()
        # Elsewhere (between pairs and calls) text is layout, not output.

    def _on_marker(self, marker: str) -> None:
        state = self._state
        out = self._out
        if marker == CALL_OPEN:
            if state == _State.LEADING:
                self._leave_leading()
            out.close_content()
            self._parts.clear()
            self._state = _State.NAME
        elif marker == CALL_CLOSE:
            if state == _State.NAME:
                out.open_call(self._take())
            out.close_call()
            self._parts.clear()
            self._state = _State.BETWEEN
        elif marker == KEY_OPEN:
            if state == _State.NAME:
                out.open_call(self._take())
            self._parts.clear()
            self._state = _State.KEY
        elif marker == KEY_CLOSE:
            self._key = self._take()
            self._state = _State.AFTER_KEY
        elif marker == VALUE_OPEN:
            self._parts.clear()
            self._state = _State.VALUE
        elif marker == VALUE_CLOSE:
            raw = "".join(self._parts)
            self._parts.clear()
            tool = out.current_tool
            if tool is not None:
                out.argument(self._key, _typed(out.tools, tool, self._key, raw))
            self._state = _State.ARGS
        elif marker == THINK_OPEN:  # only in LEADING: the whitespace before it is dropped
            self._leading.clear()
            self._state = _State.REASONING
        elif marker == THINK_CLOSE:
            if state == _State.LEADING:
                self._leave_leading()
            self._state = _State.CONTENT

    def _on_end(self) -> None:
        if self._state == _State.LEADING:
            self._leave_leading()

    def _leave_leading(self) -> None:
        text = "".join(self._leading)
        self._leading.clear()
        if self._leading_to_reasoning:
            self._state = _State.REASONING
            self._out.reasoning(text)
        else:
            self._state = _State.CONTENT
            self._out.content(text)

    def _take(self) -> str:
        text = "".join(self._parts).strip()
        self._parts.clear()
        return text


def _typed(tools: ToolSchemas, tool: str, key: str, raw: str) -> Any:
    """The value of one argument: converted by the key's schema, else the raw text."""
    schema = tools.property(tool, key)
    if schema is None:
        return raw
    value = coerce(raw, schema)
    return raw if value is NO_FIT else value
