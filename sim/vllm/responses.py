"""``POST /v1/responses`` on the simulated vLLM server: the request served as a chat request,
its answer given in the Responses API's shapes (a ``response`` object, or its events)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Literal

import orjson

from sim.vllm.engine import Step
from sim.vllm.errors import ApiError, schema_error
from sim.vllm.formats import Formatter

# An output item's kind, and a tool call's index: what a streamed piece goes into.
_Item = tuple[Literal["reasoning", "message", "call"], int | None]
# A streamed piece: reasoning or content text, or a tool call's delta.
_Piece = str | dict[str, Any]


def chat_request(body: Any) -> dict[str, Any]:
    """The chat request a Responses ``body`` asks for (the fields the simulator reads)."""
    if not isinstance(body, dict) or "input" not in body:
        raise schema_error(
            "1 validation error:\n  {'type': 'missing', 'loc': 'body.input', 'msg': "
            "'Field required'}",
            "body.input",
        )
    previous = body.get("previous_response_id")
    if previous is not None:
        # vLLM keeps no responses unless its store is enabled: any earlier id is unknown.
        raise ApiError(
            404,
            f"Response with id '{previous}' not found.",
            "response_id",
            "invalid_request_error",
        )
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body["input"]
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item["role"], "content": _text_of(item["content"])})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function", "function": item}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": _text_of(output)}
            )
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    chat["stream"] = bool(body.get("stream"))
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    tools = [t for t in body.get("tools") or [] if t.get("type") == "function"]
    if tools:
        chat["tools"] = [
            {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
            for t in tools
        ]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    if choice is not None:
        chat["tool_choice"] = choice
    for key in ("temperature", "top_p", "chat_template_kwargs"):
        if body.get(key) is not None:
            chat[key] = body[key]
    return chat


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [])


class ResponsesFormatter:
    """The Responses view of one chat answer, in vLLM 0.32's shapes and key order."""

    def __init__(self, chat: Formatter, body: dict[str, Any], max_tokens: int | None) -> None:
        self._chat = chat
        self._body = body
        self._id = chat.response_id
        self._max_tokens = max_tokens
        self._sequence = 0

    def response(self, steps: Sequence[Step], usage_body: dict[str, Any]) -> dict[str, Any]:
        """The whole ``response`` object."""
        chat = self._chat.response([steps], usage_body, None)
        message = chat["choices"][0]["message"]
        output = []
        if message.get("reasoning"):
            output.append(_reasoning(message["reasoning"], "completed"))
        if message.get("content") is not None or not message.get("tool_calls"):
            output.append(_message(message.get("content") or "", "completed"))
        for call in message.get("tool_calls") or []:
            function = call["function"]
            output.append(_call(call["id"], function["name"], function["arguments"], "completed"))
        return self._object(chat["choices"][0]["finish_reason"], output, usage_body)

    async def events(
        self,
        steps: Sequence[Step],
        usage_body: dict[str, Any],
        pause: Callable[[], Awaitable[None]],
    ) -> AsyncIterator[bytes]:
        """The stream: lifecycle events around one item per kind of output, in order; it
        ends with ``response.completed`` whatever the final status."""
        start = self._object(None, [], None)
        yield self._event("response.created", response=start)
        yield self._event("response.in_progress", response=start)
        output: list[dict[str, Any]] = []
        current: _Item | None = None  # the open item
        finish = "length"
        for index, step in enumerate(steps):
            if index:
                await pause()
            delta = self._chat.chunk(step, 0)["choices"][0]["delta"]
            finish = step.finish_reason or finish
            pieces: list[tuple[_Item, _Piece]] = []
            if delta.get("reasoning"):
                pieces.append((("reasoning", None), delta["reasoning"]))
            if delta.get("content"):
                pieces.append((("message", None), delta["content"]))
            for call in delta.get("tool_calls") or []:
                pieces.append((("call", call["index"]), call))
            for kind, piece in pieces:
                if kind != current:
                    if current is not None:
                        for event in self._done(output):
                            yield event
                    current = kind
                    output.append(self._new(kind[0], piece))
                    added = output[-1]
                    if "content" in added:
                        added = {**added, "content": []}
                    yield self._event(
                        "response.output_item.added", item=added, output_index=len(output) - 1
                    )
                    if kind[0] != "call":
                        part = {**output[-1]["content"][0]}
                        if part["type"] == "output_text":
                            part["logprobs"] = []
                        yield self._event(
                            "response.content_part.added", **self._at(output, part=part)
                        )
                for event in self._grow(output, kind[0], piece):
                    yield event
        if current is not None:
            for event in self._done(output):
                yield event
        final = self._object(self._chat_finish(finish), output, usage_body)
        yield self._event("response.completed", response=final)

    def _chat_finish(self, finish: str) -> str:
        return "length" if finish == "length" else "stop"

    def _new(self, kind: str, piece: _Piece) -> dict[str, Any]:
        if isinstance(piece, dict):  # a tool call
            function = piece.get("function", {})
            return _call(piece.get("id") or "", function.get("name") or "", "", "in_progress")
        if kind == "reasoning":
            return _reasoning("", "in_progress")
        return _message("", "in_progress")

    def _grow(self, output: list[dict[str, Any]], kind: str, piece: _Piece) -> list[bytes]:
        item = output[-1]
        if isinstance(piece, dict):  # a tool call
            arguments = piece.get("function", {}).get("arguments") or ""
            if not arguments:
                return []
            item["arguments"] += arguments
            return [
                self._event(
                    "response.function_call_arguments.delta",
                    delta=arguments,
                    item_id=item["id"],
                    output_index=len(output) - 1,
                )
            ]
        item["content"][0]["text"] += piece
        if kind == "reasoning":
            return [self._event("response.reasoning_text.delta", **self._at(output, delta=piece))]
        return [
            self._event("response.output_text.delta", **self._at(output, delta=piece, logprobs=[]))
        ]

    def _done(self, output: list[dict[str, Any]]) -> list[bytes]:
        item = output[-1]
        item["status"] = "completed"
        events = []
        if item["type"] == "function_call":
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    arguments=item["arguments"],
                    item_id=item["id"],
                    name=item["name"],
                    output_index=len(output) - 1,
                )
            )
        else:
            part = item["content"][0]
            text = part["text"]
            if item["type"] == "reasoning":
                done = self._event("response.reasoning_text.done", **self._at(output, text=text))
            else:
                done = self._event(
                    "response.output_text.done", **self._at(output, logprobs=[], text=text)
                )
            events.append(done)
            events.append(self._event("response.content_part.done", **self._at(output, part=part)))
        events.append(
            self._event("response.output_item.done", item=item, output_index=len(output) - 1)
        )
        return events

    def _at(self, output: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        """An item's event fields in vLLM's (alphabetical) order."""
        at = {"content_index": 0, "item_id": output[-1]["id"], "output_index": len(output) - 1}
        return dict(sorted({**at, **fields}.items()))

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {**fields, "sequence_number": self._sequence, "type": kind}
        payload = dict(sorted(payload.items()))
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    def _object(
        self, finish: str | None, output: list[dict[str, Any]], usage_body: dict[str, Any] | None
    ) -> dict[str, Any]:
        body = self._body
        status = (
            "in_progress" if finish is None else "incomplete" if finish == "length" else "completed"
        )
        usage = None
        if usage_body is not None:
            cached = (usage_body.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            usage = {
                "input_tokens": usage_body["prompt_tokens"],
                "input_tokens_details": {
                    "cached_tokens": cached,
                    "cache_write_tokens": 0,
                    "input_tokens_per_turn": [],
                    "cached_tokens_per_turn": [],
                },
                "output_tokens": usage_body["completion_tokens"],
                "output_tokens_details": {
                    "reasoning_tokens": 0,
                    "tool_output_tokens": 0,
                    "output_tokens_per_turn": [],
                    "tool_output_tokens_per_turn": [],
                },
                "total_tokens": usage_body["total_tokens"],
            }
        tools = [_tool(t) for t in body.get("tools") or []]
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self._id,
            "created_at": self._chat.created,
            "incomplete_details": incomplete,
            "instructions": body.get("instructions"),
            "metadata": body.get("metadata"),
            "model": self._chat.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "temperature": _number(body.get("temperature"), 1.0),
            "tool_choice": body.get("tool_choice", "auto" if tools else "none"),
            "tools": tools,
            "top_p": _number(body.get("top_p"), 1.0),
            "background": bool(body.get("background")),
            "max_output_tokens": self._max_tokens,
            "max_tool_calls": body.get("max_tool_calls"),
            "previous_response_id": body.get("previous_response_id"),
            "prompt": body.get("prompt"),
            "reasoning": body.get("reasoning"),
            "service_tier": body.get("service_tier", "auto"),
            "status": status,
            "text": _text_config(body.get("text")),
            "top_logprobs": body.get("top_logprobs"),
            "truncation": body.get("truncation", "disabled"),
            "usage": usage,
            "user": body.get("user"),
            "presence_penalty": _number(body.get("presence_penalty"), 0.0),
            "frequency_penalty": _number(body.get("frequency_penalty"), 0.0),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }


def _number(value: Any, unset: float) -> float:
    """A sampling number as the response reports it: ``unset`` when absent or null, as
    vLLM samples with its default then."""
    return unset if value is None else float(value)


def _text_config(text: Any) -> Any:
    """``text`` as the response echoes it: the format and its ``verbosity``."""
    if not isinstance(text, dict):
        return text
    return {"format": text.get("format"), "verbosity": text.get("verbosity")}


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A request tool as the response lists it (a function tool with every field)."""
    if tool.get("type") != "function":
        return tool
    return {
        "name": tool.get("name"),
        "parameters": tool.get("parameters"),
        "strict": tool.get("strict"),
        "type": "function",
        "allowed_callers": tool.get("allowed_callers"),
        "async": tool.get("async"),
        "defer_loading": tool.get("defer_loading"),
        "description": tool.get("description"),
        "output_schema": tool.get("output_schema"),
    }


def _item_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:16]


def _reasoning(text: str, status: str) -> dict[str, Any]:
    return {
        "id": _item_id("rs_"),
        "summary": [],
        "type": "reasoning",
        "content": [{"text": text, "type": "reasoning_text"}],
        "encrypted_content": None,
        "status": status,
    }


def _message(text: str, status: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = [
        {"annotations": [], "text": text, "type": "output_text", "logprobs": None}
    ]
    return {
        "id": _item_id("msg_"),
        "content": content if text or status == "in_progress" else [],
        "role": "assistant",
        "status": status,
        "type": "message",
        "phase": None,
    }


def _call(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
        "type": "function_call",
        "id": _item_id("fc_"),
        "status": status,
    }
