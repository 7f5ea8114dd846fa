"""DeepSeek-V3.2 (`deepseek_v32`) reasoning and DSML tool-call parser.

Reasoning ends at `</think>` (thinking mode only). Tool calls are a
`<｜DSML｜function_calls>` block of `<｜DSML｜invoke name="…">` elements holding
`<｜DSML｜parameter name="…" string="true|false">` values. See docs/output-formats.md §2.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import IntEnum
from types import MappingProxyType
from typing import Any

from router.parsers.arguments import NO_FIT, ToolSchemas, conform, parse_json
from router.parsers.builder import MessageBuilder
from router.parsers.machine import MarkupParser
from router.parsers.scanner import Markers

THINK_CLOSE = "</think>"
BLOCK_OPEN = "<｜DSML｜function_calls>"
BLOCK_CLOSE = "</｜DSML｜function_calls>"
INVOKE_OPEN = "<｜DSML｜invoke"  # attributes follow, up to ">"
INVOKE_CLOSE = "</｜DSML｜invoke>"
PARAM_OPEN = "<｜DSML｜parameter"  # attributes follow, up to ">"
PARAM_CLOSE = "</｜DSML｜parameter>"
TAG_END = ">"

_NAME = re.compile(r'\bname\s*=\s*"([^"]*)"')
_STRING = re.compile(r'\bstring\s*=\s*"([^"]*)"')


class _State(IntEnum):
    REASONING = 0
    CONTENT = 1
    BLOCK = 2  # inside function_calls, between invokes
    INVOKE_TAG = 3  # reading an invoke's attributes
    INVOKE = 4  # inside an invoke, between parameters
    PARAM_TAG = 5  # reading a parameter's attributes
    VALUE = 6
    AFTER = 7  # after the block: text is dropped


def _table(tools: bool) -> Mapping[_State, Markers]:
    starts = (BLOCK_OPEN, INVOKE_OPEN) if tools else ()
    return MappingProxyType(
        {
            # DSML written before `</think>` is reasoning, as vLLM's reasoning parser reads it.
            _State.REASONING: Markers((THINK_CLOSE,)),
            _State.CONTENT: Markers(starts),
            _State.BLOCK: Markers((INVOKE_OPEN, BLOCK_CLOSE)),
            _State.INVOKE_TAG: Markers((TAG_END,)),
            _State.INVOKE: Markers((PARAM_OPEN, INVOKE_CLOSE, INVOKE_OPEN, BLOCK_CLOSE)),
            _State.PARAM_TAG: Markers((TAG_END,)),
            # A parameter missing its closing tag ends where the next element begins.
            _State.VALUE: Markers((PARAM_CLOSE, PARAM_OPEN, INVOKE_CLOSE, BLOCK_CLOSE)),
            _State.AFTER: Markers((BLOCK_OPEN, INVOKE_OPEN)),
        }
    )


_WITH_TOOLS = _table(tools=True)
_WITHOUT_TOOLS = _table(tools=False)


class DeepSeekV32Parser(MarkupParser):
    """Incremental parser for DeepSeek-V3.2 output.

    With `thinking` the output starts inside reasoning, up to `</think>`. Content is
    the text before the first tool-call block (null if only whitespace). Calls are kept
    whatever their tool's name, as vLLM keeps them. A sole argument `arguments` or
    `input` that the tool does not declare, holding an object of declared ones, stands
    for those arguments and is unwrapped. Without tools, DSML markup is plain content,
    as vLLM leaves it.
    """

    __slots__ = ("_key", "_parts", "_raw_string", "_state", "_table", "_wrapper")

    def __init__(self, name: str = "deepseek_v32", *, tools: ToolSchemas, thinking: bool) -> None:
        out = MessageBuilder(
            tools, strip_before_calls=False, strip_reasoning=False, known_tools_only=False
        )
        super().__init__(out)
        self._table = _WITH_TOOLS if tools else _WITHOUT_TOOLS
        self._state = _State.REASONING if thinking else _State.CONTENT
        self._parts: list[str] = []  # the tag or value being read
        self._key: str | None = None
        self._raw_string = False
        # A first argument that may wrap all the others: held until the call shows.
        self._wrapper: tuple[str, Any] | None = None

    def _markers(self) -> Markers:
        return self._table[self._state]

    def _on_text(self, text: str) -> None:
        state = self._state
        if state == _State.REASONING:
            self._out.reasoning(text)
        elif state == _State.CONTENT:
            self._out.content(text)
        elif state in (_State.INVOKE_TAG, _State.PARAM_TAG, _State.VALUE):
            self._parts.append(text)
        # Elsewhere text is layout between elements, or dropped after the block.

    def _on_marker(self, marker: str) -> None:
        state = self._state
        out = self._out
        if state == _State.VALUE:
            # The value ends here, closed properly or (tolerated) by the next element.
            self._end_value(marker)
        if marker == TAG_END:
            attrs = "".join(self._parts)
            self._parts.clear()
            if state == _State.INVOKE_TAG:
                name = _NAME.search(attrs)
                out.open_call(name.group(1) if name else "")
                self._state = _State.INVOKE
            else:
                name = _NAME.search(attrs)
                string = _STRING.search(attrs)
                self._key = name.group(1) if name else None
                self._raw_string = string is not None and string.group(1) == "true"
                self._state = _State.VALUE
        elif marker == INVOKE_OPEN:
            out.close_content()
            self._close_call()
            self._state = _State.INVOKE_TAG
        elif marker == PARAM_OPEN:
            self._state = _State.PARAM_TAG
        elif marker == PARAM_CLOSE:
            self._state = _State.INVOKE
        elif marker == INVOKE_CLOSE:
            self._close_call()
            self._state = _State.BLOCK
        elif marker == BLOCK_OPEN:
            out.close_content()
            self._state = _State.BLOCK
        elif marker == BLOCK_CLOSE:
            self._close_call()
            self._state = _State.AFTER
        elif marker == THINK_CLOSE:
            self._state = _State.CONTENT

    def _on_end(self) -> None:
        if self._state == _State.VALUE:
            self._parts.clear()  # a value cut off by max_tokens is not kept
        self._close_call()

    def _end_value(self, marker: str) -> None:
        raw = "".join(self._parts)
        self._parts.clear()
        tool, key = self._out.current_tool, self._key
        self._key = None
        if tool is None or key is None:
            return
        if marker in (INVOKE_CLOSE, BLOCK_CLOSE):
            # Unclosed, ended by the invoke's or the block's end: its newline is layout.
            # (Ended by the next parameter, it runs up to that one, newline and all.)
            raw = raw.rstrip()
        value = raw if self._raw_string else _parsed(raw)
        self._add_argument(tool, key, value)

    def _add_argument(self, tool: str, key: str, value: Any) -> None:
        out = self._out
        if self._wrapper is not None:
            self._flush_wrapper(tool, unwrap=False)
        elif key in _WRAPPERS and not out.has_arguments:
            declared = out.tools.properties(tool)
            if declared and key not in declared:
                self._wrapper = (key, value)
                return
        out.argument(key, _typed(out.tools, tool, key, value))

    def _close_call(self) -> None:
        tool = self._out.current_tool
        if self._wrapper is not None and tool is not None:
            self._flush_wrapper(tool, unwrap=True)
        self._wrapper = None
        self._out.close_call()

    def _flush_wrapper(self, tool: str, *, unwrap: bool) -> None:
        """Write the held first argument: as the arguments it wraps when it is the call's
        only one and wraps declared arguments only, else as itself."""
        assert self._wrapper is not None
        key, value = self._wrapper
        self._wrapper = None
        out = self._out
        inner = _parsed(value) if isinstance(value, str) else value
        if unwrap and isinstance(inner, dict) and set(inner) <= set(out.tools.properties(tool)):
            for inner_key, inner_value in inner.items():
                out.argument(inner_key, _typed(out.tools, tool, inner_key, inner_value))
            return
        out.argument(key, _typed(out.tools, tool, key, value))


_WRAPPERS = ("arguments", "input")


def _parsed(raw: str) -> Any:
    """A `string="false"` value: its JSON value, else the raw text."""
    value = parse_json(raw)
    return raw if value is NO_FIT else value


def _typed(tools: ToolSchemas, tool: str, key: str, value: Any) -> Any:
    """An argument value re-typed by the key's schema (raw strings too), if it has one."""
    schema = tools.property(tool, key)
    return value if schema is None else conform(value, schema)
