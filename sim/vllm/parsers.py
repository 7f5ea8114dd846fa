"""vLLM's reasoning and tool-call parsers, as the simulated server runs them.

``--reasoning-parser`` (``glm45``, ``deepseek_v3``) splits reasoning from content;
``--tool-call-parser`` (``glm45``, ``glm47``, ``deepseek_v32``) with
``--enable-auto-tool-choice`` turns tool-call markup into ``tool_calls``. The formats and
rules are those of docs/output-formats.md; the sim has its own small implementation (it
never imports the gateway): every step re-reads the whole text so far and hands out only
what can no longer change, so streamed deltas concatenate to the non-streamed message.

Reasoning: ``glm45`` thinks unless ``chat_template_kwargs`` turns it off, ``deepseek_v3``
only when it turns it on (``thinking`` and ``enable_thinking`` are synonyms, either one
true turns it on). Thinking, the output starts inside reasoning. GLM's reasoning ends at
``</think>`` or where a tool call starts, a ``<think>`` in it is dropped, one in content
opens it again, and its trailing whitespace is dropped; DeepSeek's ends at ``</think>``
only. Content keeps its whitespace, except GLM's before a call. Without tools (or with
``tool_choice: "none"``) no call is made: GLM's call markup is left out of the content,
DeepSeek's stays in it. GLM drops calls to tools the request did not declare; DeepSeek
keeps them. Argument values are typed simply (raw strings, else JSON), not by the full
schema rules of docs/output-formats.md.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

REASONING_PARSERS = ("glm45", "deepseek_v3")
TOOL_CALL_PARSERS = ("glm45", "glm47", "deepseek_v32")

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
GLM_CALL_OPEN, GLM_CALL_CLOSE = "<tool_call>", "</tool_call>"
DSML_BLOCK_OPEN, DSML_BLOCK_CLOSE = "<｜DSML｜function_calls>", "</｜DSML｜function_calls>"
DSML_INVOKE_OPEN = "<｜DSML｜invoke"

_GLM_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
_DSML_INVOKE = re.compile(r'<｜DSML｜invoke\s+name="([^"]*)"\s*>(.*?)</｜DSML｜invoke>', re.DOTALL)
_DSML_PARAM = re.compile(
    r'<｜DSML｜parameter\s+name="([^"]*)"(?:\s+string="([^"]*)")?\s*>(.*?)</｜DSML｜parameter>',
    re.DOTALL,
)


@dataclass(frozen=True, slots=True)
class ParserConfig:
    """The server's parser flags."""

    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False

    @property
    def active(self) -> bool:
        return self.reasoning_parser is not None or self.tool_call_parser is not None


@dataclass(slots=True)
class Call:
    """A complete tool call."""

    id: str
    name: str
    arguments: str

    def delta(self, index: int) -> dict[str, Any]:
        function = {"name": self.name, "arguments": self.arguments}
        return {"index": index, "id": self.id, "type": "function", "function": function}

    def message(self) -> dict[str, Any]:
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


@dataclass(slots=True)
class Parsed:
    """What a text (so far) decides: reasoning, content and complete calls."""

    reasoning: str = ""
    content: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments JSON)


def thinks(config: ParserConfig, kwargs: Mapping[str, Any] | None) -> bool:
    """Whether the model's answer starts inside reasoning (the server splits reasoning off)."""
    return config.reasoning_parser is not None and _thinking(config.reasoning_parser, kwargs)


def _thinking(parser: str, kwargs: Mapping[str, Any] | None) -> bool:
    thinking, enable_thinking = (
        (kwargs or {}).get("thinking"),
        (kwargs or {}).get("enable_thinking"),
    )
    if thinking is None and enable_thinking is None:
        return parser == "glm45"
    return bool(thinking) or bool(enable_thinking)


def _held(text: str, markers: tuple[str, ...]) -> int:
    """Where a possible partial marker at the end of `text` begins (len(text) if none)."""
    for start in range(max(len(text) - max(map(len, markers), default=0), 0), len(text)):
        tail = text[start:]
        if any(m.startswith(tail) and m != tail for m in markers):
            return start
    return len(text)


def _first(text: str, markers: tuple[str, ...], start: int = 0) -> tuple[int, str | None]:
    hits = [(text.find(m, start), m) for m in markers]
    found = [(i, m) for i, m in hits if i >= 0]
    return min(found) if found else (-1, None)


class NativeParser:
    """One chat completion's reasoning and tool-call parsing, incremental."""

    def __init__(
        self,
        config: ParserConfig,
        *,
        tools: list[dict[str, Any]] | None,
        tool_choice: str | dict[str, Any] | None,
        chat_template_kwargs: Mapping[str, Any] | None,
    ) -> None:
        self._reasoning_parser = config.reasoning_parser
        self._thinking = config.reasoning_parser is not None and _thinking(
            config.reasoning_parser, chat_template_kwargs
        )
        self._schemas: dict[str, dict[str, Any]] = {}
        for tool in tools or []:
            function = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                params = function.get("parameters")
                props = params.get("properties") if isinstance(params, dict) else None
                self._schemas[function["name"]] = props if isinstance(props, dict) else {}
        self._tool_parser = config.tool_call_parser if config.enable_auto_tool_choice else None
        self._calls_allowed = bool(self._schemas) and tool_choice != "none"
        self._named_choice = isinstance(tool_choice, dict)
        self._glm_family = config.tool_call_parser in ("glm45", "glm47") or (
            config.tool_call_parser is None and config.reasoning_parser == "glm45"
        )
        self._text = ""
        self._sent = Parsed()
        self._calls: list[Call] = []

    def feed(self, text: str) -> dict[str, Any]:
        """The delta (reasoning, content, tool calls) decided by the next text piece."""
        self._text += text
        return self._delta(self._parse(final=False))

    def finish(self) -> dict[str, Any]:
        """End of output: the rest of the message, as a delta."""
        return self._delta(self._parse(final=True))

    def message(self) -> tuple[str | None, str | None, list[dict[str, Any]]]:
        """(reasoning, content, tool_calls) of the whole message, after `finish`."""
        sent = self._sent
        calls = [c.message() for c in self._calls]
        return sent.reasoning or None, sent.content or None, calls

    def finish_reason(self, finish: str | None) -> str | None:
        """vLLM's finish reason: `tool_calls` when calls were made (auto choice)."""
        if finish == "stop" and self._calls and not self._named_choice:
            return "tool_calls"
        return finish

    def _delta(self, now: Parsed) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        sent = self._sent
        if len(now.reasoning) > len(sent.reasoning):
            delta["reasoning"] = now.reasoning[len(sent.reasoning) :]
            sent.reasoning = now.reasoning
        if len(now.content) > len(sent.content):
            delta["content"] = now.content[len(sent.content) :]
            sent.content = now.content
        if len(now.calls) > len(sent.calls):
            fresh = []
            for name, arguments in now.calls[len(sent.calls) :]:
                call = Call(f"chatcmpl-tool-{uuid.uuid4().hex}", name, arguments)
                self._calls.append(call)
                fresh.append(call.delta(len(self._calls) - 1))
            sent.calls = list(now.calls)
            delta["tool_calls"] = fresh
        return delta

    def _parse(self, *, final: bool) -> Parsed:
        if self._glm_family:
            return self._glm(final=final)
        return self._dsml(final=final)

    def _glm(self, *, final: bool) -> Parsed:
        text = self._text
        parsed = Parsed()
        think = (THINK_OPEN, THINK_CLOSE) if self._thinking else ()
        markers = (*think, GLM_CALL_OPEN) if self._tool_parser else think
        state = "reasoning" if self._thinking else "content"
        reasoning: list[str] = []
        content: list[str] = []
        bodies: list[str] = []  # the calls' text between <tool_call> and </tool_call>
        said = {"reasoning": reasoning, "content": content, "between": []}
        pos = 0
        while True:
            current = (GLM_CALL_OPEN,) if state == "between" else markers
            index, marker = _first(text, current, pos)
            if marker is None:
                end = len(text) if final else pos + _held(text[pos:], current)
                said[state].append(text[pos:end])
                break
            said[state].append(text[pos:index])
            pos = index + len(marker)
            if marker == GLM_CALL_OPEN:
                close = text.find(GLM_CALL_CLOSE, pos)
                if close < 0:
                    if final:  # cut off: its complete arguments count
                        bodies.append(text[pos:])
                    break
                bodies.append(text[pos:close])
                pos = close + len(GLM_CALL_CLOSE)
                # With calls, the text after one is not content; without, it is.
                state = "between" if self._calls_allowed else "content"
            else:
                state = "reasoning" if marker == THINK_OPEN else "content"
        parsed.reasoning = "".join(reasoning).rstrip()
        before = "".join(content)
        if not self._calls_allowed:
            parsed.content = before
        elif bodies or not final:  # a call drops the whitespace before it
            parsed.content = before.rstrip() if before.strip() else ""
        else:
            parsed.content = before
        if self._calls_allowed:
            for body in bodies:
                self._glm_call(body, parsed)
        return parsed

    def _glm_call(self, body: str, parsed: Parsed) -> None:
        name = body.split("<arg_key>", 1)[0].strip()
        if name not in self._schemas:
            return
        props = self._schemas[name]
        arguments: dict[str, Any] = {}
        for key, value in _GLM_PAIR.findall(body):
            key = key.strip()
            if key not in arguments:
                arguments[key] = _glm_value(value, props.get(key))
        parsed.calls.append((name, json.dumps(arguments, ensure_ascii=False)))

    def _dsml(self, *, final: bool) -> Parsed:
        text = self._text
        parsed = Parsed()
        rest = text
        if self._thinking:
            index = text.find(THINK_CLOSE)
            if index < 0:
                end = len(text) if final else _held(text, (THINK_CLOSE,))
                parsed.reasoning = text[:end]
                return parsed
            parsed.reasoning, rest = text[:index], text[index + len(THINK_CLOSE) :]
        starts = (DSML_BLOCK_OPEN, DSML_INVOKE_OPEN)
        if not (self._tool_parser and self._calls_allowed):
            parsed.content = rest
            return parsed
        index, _ = _first(rest, starts)
        if index < 0:
            end = len(rest) if final else _held(rest, starts)
            said = rest[:end]
            parsed.content = said if final or said.strip() else ""
            return parsed
        parsed.content = rest[:index] if rest[:index].strip() else ""
        block = rest[index:].split(DSML_BLOCK_CLOSE, 1)[0]
        for name, body in _DSML_INVOKE.findall(block):
            if not name:
                continue
            arguments: dict[str, Any] = {}
            for key, string, value in _DSML_PARAM.findall(body):
                if key not in arguments:
                    arguments[key] = value if string == "true" else _json_or_raw(value)
            parsed.calls.append((name, json.dumps(arguments, ensure_ascii=False)))
        return parsed


def _glm_value(raw: str, schema: object) -> Any:
    """A GLM argument value: raw for a string (or unknown) key, else JSON if it parses."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind is None or kind == "string":
        return raw
    return _json_or_raw(raw)


def _json_or_raw(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw
