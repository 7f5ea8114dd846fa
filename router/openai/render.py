"""Renders relay output as OpenAI responses: SSE chunks while streaming, one JSON at the end.

One renderer per endpoint; both share the same small interface so the latency path never
branches on the endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from router.openai.sse import event as sse
from router.parsers import ParsedDelta, ParsedMessage


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None

    def as_dict(self) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "completion_tokens": self.completion_tokens,
        }
        if self.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return usage


StopReason = str | int | None
"""What ended the output, as vLLM reports it: the stop string or stop token id that matched,
None for EOS or the length limit."""


class Renderer(Protocol):
    def start(self) -> bytes | None: ...
    def delta(self, delta: ParsedDelta, usage: Usage | None = None) -> bytes | None:
        """`usage`: the running count, for `stream_options.continuous_usage_stats`."""
        ...

    def finish(
        self, finish_reason: str, stop_reason: StopReason, usage: Usage | None = None
    ) -> bytes: ...
    def usage(self, usage: Usage) -> bytes: ...
    def response(
        self, message: ParsedMessage, finish_reason: str, stop_reason: StopReason, usage: Usage
    ) -> dict[str, Any]: ...


# Top-level fields vLLM's answers carry that the latency path has nothing to put in.
_VLLM_RESPONSE_FIELDS: dict[str, Any] = {
    "service_tier": None,
    "system_fingerprint": None,
    "kv_transfer_params": None,
}


class _Base:
    object_chunk = ""

    def __init__(self, *, response_id: str, created: int, model: str) -> None:
        self._head = {
            "id": response_id,
            "object": self.object_chunk,
            "created": created,
            "model": model,
        }

    def usage(self, usage: Usage) -> bytes:
        return sse({**self._head, "choices": [], "usage": usage.as_dict()})

    def _event(self, choice: dict[str, Any], usage: Usage | None) -> bytes:
        if usage is None:
            return sse({**self._head, "choices": [choice]})
        return sse({**self._head, "choices": [choice], "usage": usage.as_dict()})


class ChatRenderer(_Base):
    object_chunk = "chat.completion.chunk"

    def start(self) -> bytes | None:
        return self._chunk({"role": "assistant", "content": ""}, None, None, None)

    def delta(self, delta: ParsedDelta, usage: Usage | None = None) -> bytes | None:
        out: dict[str, Any] = {}
        if delta.reasoning:
            out["reasoning_content"] = delta.reasoning
        if delta.content:
            out["content"] = delta.content
        if delta.tool_calls:
            out["tool_calls"] = [_tool_call_delta(c) for c in delta.tool_calls]
        return self._chunk(out, None, None, usage) if out else None

    def finish(
        self, finish_reason: str, stop_reason: StopReason, usage: Usage | None = None
    ) -> bytes:
        return self._chunk({}, finish_reason, stop_reason, usage)

    def response(
        self, message: ParsedMessage, finish_reason: str, stop_reason: StopReason, usage: Usage
    ) -> dict[str, Any]:
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": message.content,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
        }
        if message.reasoning is not None:
            msg["reasoning_content"] = message.reasoning
        msg["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
        choice = {
            "index": 0,
            "message": msg,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
        }
        return {
            **self._head,
            "object": "chat.completion",
            "choices": [choice],
            **_VLLM_RESPONSE_FIELDS,
            "usage": usage.as_dict(),
            "prompt_logprobs": None,
        }

    def _chunk(
        self,
        delta: dict[str, Any],
        finish_reason: str | None,
        stop_reason: StopReason,
        usage: Usage | None,
    ) -> bytes:
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
        }
        return self._event(choice, usage)


class CompletionRenderer(_Base):
    object_chunk = "text_completion"

    def start(self) -> bytes | None:
        return None

    def delta(self, delta: ParsedDelta, usage: Usage | None = None) -> bytes | None:
        return self._chunk(delta.content, None, None, usage) if delta.content else None

    def finish(
        self, finish_reason: str, stop_reason: StopReason, usage: Usage | None = None
    ) -> bytes:
        return self._chunk("", finish_reason, stop_reason, usage)

    def response(
        self, message: ParsedMessage, finish_reason: str, stop_reason: StopReason, usage: Usage
    ) -> dict[str, Any]:
        choice = {
            "index": 0,
            "text": message.content or "",
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
            "prompt_logprobs": None,
        }
        return {
            **self._head,
            "choices": [choice],
            **_VLLM_RESPONSE_FIELDS,
            "usage": usage.as_dict(),
        }

    def _chunk(
        self, text: str, finish_reason: str | None, stop_reason: StopReason, usage: Usage | None
    ) -> bytes:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
        }
        return self._event(choice, usage)


def _tool_call_delta(call: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"index": call.index}
    function: dict[str, Any] = {}
    if call.id is not None:
        out["id"] = call.id
        out["type"] = "function"
    if call.name is not None:
        function["name"] = call.name
    if call.arguments or call.name is not None:
        function["arguments"] = call.arguments
    out["function"] = function
    return out


def make_renderer(chat: bool, *, response_id: str, created: int, model: str) -> Renderer:
    cls = ChatRenderer if chat else CompletionRenderer
    return cls(response_id=response_id, created=created, model=model)
