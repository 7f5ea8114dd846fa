"""GLM-4.5/4.6 (`glm45`) and GLM-4.7/5/5.1 (`glm47`) reasoning and tool-call parser.

Reasoning sits in `<think>…</think>`; each tool call is `<tool_call>NAME` followed by
`<arg_key>K</arg_key><arg_value>V</arg_value>` pairs and `</tool_call>`. Values are
typed by the tool's JSON schema. Both variants read output as vLLM 0.32's GLM parser
does (it serves both names). See docs/output-formats.md §1.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from types import MappingProxyType
from typing import Any

from router.parsers.arguments import ToolSchemas, coerce
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
    REASONING = 0
    CONTENT = 1
    NAME = 2  # after <tool_call>, reading the name
    ARGS = 3  # inside a call, between pairs
    KEY = 4
    AFTER_KEY = 5
    VALUE = 6
    BETWEEN = 7  # after a call; only another call matters


def _table(thinking: bool) -> Mapping[_State, Markers]:
    # With thinking on, `<think>` and `</think>` mean something in reasoning and content
    # alike; with it off they are text.
    think = (THINK_OPEN, THINK_CLOSE) if thinking else ()
    return MappingProxyType(
        {
            _State.REASONING: Markers((*think, CALL_OPEN)),
            _State.CONTENT: Markers((*think, CALL_OPEN)),
            _State.NAME: Markers((KEY_OPEN, CALL_CLOSE)),
            _State.ARGS: Markers((KEY_OPEN, CALL_CLOSE)),
            _State.KEY: Markers((KEY_CLOSE, CALL_CLOSE)),
            _State.AFTER_KEY: Markers((VALUE_OPEN, KEY_OPEN, CALL_CLOSE)),
            _State.VALUE: Markers((VALUE_CLOSE,)),
            _State.BETWEEN: Markers((CALL_OPEN,)),
        }
    )


_THINKING = _table(thinking=True)
_NOT_THINKING = _table(thinking=False)


class GlmParser(MarkupParser):
    """Incremental parser for GLM output.

    With `thinking` on, the output starts inside reasoning (the chat template opened
    it, and GLM-4.5 writes its own `<think>` there): a `<think>` in reasoning is
    dropped, `</think>` ends reasoning, a `<think>` in content opens it again and a
    stray `</think>` there is dropped; trailing reasoning whitespace is dropped. With it
    off, the output is content and those tags are text. Calls are read with or without
    tools; without them (none declared, or `tool_choice: "none"`) no call is reported,
    the call markup is left out and the text around calls stays content, as vLLM does.
    """

    __slots__ = ("_calls_allowed", "_key", "_parts", "_state", "_table")

    def __init__(self, variant: str, *, tools: ToolSchemas, thinking: bool) -> None:
        if variant not in ("glm45", "glm47"):
            raise ValueError(f"unknown GLM variant {variant!r}")
        out = MessageBuilder(
            tools, strip_before_calls=True, strip_reasoning=True, known_tools_only=True
        )
        super().__init__(out)
        self._table = _THINKING if thinking else _NOT_THINKING
        self._state = _State.REASONING if thinking else _State.CONTENT
        self._calls_allowed = bool(tools)
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
        # Elsewhere (between pairs and calls) text is layout, not output.

    def _on_marker(self, marker: str) -> None:
        state = self._state
        out = self._out
        if marker == CALL_OPEN:
            if self._calls_allowed:
                out.close_content()
            self._parts.clear()
            self._state = _State.NAME
        elif marker == CALL_CLOSE:
            if state == _State.NAME:
                self._open_call(self._take())
            out.close_call()
            self._parts.clear()
            self._state = _State.BETWEEN if self._calls_allowed else _State.CONTENT
        elif marker == KEY_OPEN:
            if state == _State.NAME:
                self._open_call(self._take())
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
        elif marker == THINK_OPEN:  # dropped in reasoning, reopens it from content
            self._state = _State.REASONING
        elif marker == THINK_CLOSE:  # ends reasoning, dropped in content
            self._state = _State.CONTENT

    def _open_call(self, name: str) -> None:
        if self._calls_allowed:
            self._out.open_call(name)

    def _take(self) -> str:
        text = "".join(self._parts).strip()
        self._parts.clear()
        return text


def _typed(tools: ToolSchemas, tool: str, key: str, raw: str) -> Any:
    """The value of one argument: typed by the key's schema, the raw text without one.
    A JSON object or array value is taken as written, not typed further."""
    schema = tools.property(tool, key)
    return raw if schema is None else coerce(raw, schema)
