"""Renders relay output as OpenAI responses: SSE chunks while streaming, one JSON at the end.

One renderer per endpoint; both share the same small interface so the latency path never
branches on the endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from router.errors import GatewayError
from router.openai.sse import DONE_EVENT, error_event
from router.openai.sse import event as sse
from router.parsers import ParsedDelta, ParsedMessage


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One output token's logprob, as text, with its best candidates (best first)."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]


Logprobs = list[TokenLogprob] | None
"""Entries for the tokens of a chunk (or of the whole answer); None: not asked for."""


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
    def start(self, usage: Usage | None = None) -> bytes | None:
        """The stream's opening event, if any; `usage`: the prompt's count, for
        `stream_options.continuous_usage_stats`."""
        ...

    def delta(
        self, delta: ParsedDelta, usage: Usage | None = None, logprobs: Logprobs = None
    ) -> bytes | None:
        """`usage`: the running count, for `stream_options.continuous_usage_stats`."""
        ...

    def finish(
        self,
        finish_reason: str,
        stop_reason: StopReason,
        usage: Usage | None = None,
        logprobs: Logprobs = None,
    ) -> bytes: ...
    def usage(self, usage: Usage) -> bytes: ...
    def error(self, error: GatewayError) -> bytes:
        """A failure after the first event."""
        ...

    def end(self) -> bytes:
        """What ends the stream, however it ended."""
        ...

    def response(
        self,
        message: ParsedMessage,
        finish_reason: str,
        stop_reason: StopReason,
        usage: Usage,
        logprobs: Logprobs = None,
    ) -> dict[str, Any]: ...


# Top-level fields vLLM's answers carry that the latency path has nothing to put in.
_VLLM_RESPONSE_FIELDS: dict[str, Any] = {
    "service_tier": None,
    "system_fingerprint": None,
    "kv_transfer_params": None,
}


class _Base:
    object_chunk = ""

    def __init__(
        self,
        *,
        response_id: str,
        created: int,
        model: str,
        client_body: Mapping[str, Any] | None = None,
    ) -> None:
        self._head = {
            "id": response_id,
            "object": self.object_chunk,
            "created": created,
            "model": model,
        }

    def usage(self, usage: Usage) -> bytes:
        return sse({**self._head, "choices": [], "usage": usage.as_dict()})

    def error(self, error: GatewayError) -> bytes:
        return error_event(error)

    def end(self) -> bytes:
        return DONE_EVENT

    def _event(self, choice: dict[str, Any], usage: Usage | None) -> bytes:
        if usage is None:
            return sse({**self._head, "choices": [choice]})
        return sse({**self._head, "choices": [choice], "usage": usage.as_dict()})


class ChatRenderer(_Base):
    object_chunk = "chat.completion.chunk"

    def start(self, usage: Usage | None = None) -> bytes | None:
        return self._chunk({"role": "assistant", "content": ""}, None, None, usage)

    def delta(
        self, delta: ParsedDelta, usage: Usage | None = None, logprobs: Logprobs = None
    ) -> bytes | None:
        out: dict[str, Any] = {}
        if delta.reasoning:
            # vLLM's field, under its newer name and its older one (both sent, as vLLM does).
            out["reasoning"] = out["reasoning_content"] = delta.reasoning
        if delta.content:
            out["content"] = delta.content
        if delta.tool_calls:
            out["tool_calls"] = [_tool_call_delta(c) for c in delta.tool_calls]
        if not out and not logprobs:
            return None
        return self._chunk(out, None, None, usage, _chat_logprobs(logprobs))

    def finish(
        self,
        finish_reason: str,
        stop_reason: StopReason,
        usage: Usage | None = None,
        logprobs: Logprobs = None,
    ) -> bytes:
        return self._chunk({}, finish_reason, stop_reason, usage, _chat_logprobs(logprobs or None))

    def response(
        self,
        message: ParsedMessage,
        finish_reason: str,
        stop_reason: StopReason,
        usage: Usage,
        logprobs: Logprobs = None,
    ) -> dict[str, Any]:
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": message.content,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
        }
        msg["reasoning"] = msg["reasoning_content"] = message.reasoning  # null included
        msg["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
        choice = {
            "index": 0,
            "message": msg,
            "logprobs": _chat_logprobs(logprobs),
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
        logprobs: dict[str, Any] | None = None,
    ) -> bytes:
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
        }
        return self._event(choice, usage)


class CompletionRenderer(_Base):
    object_chunk = "text_completion"

    def __init__(
        self,
        *,
        response_id: str,
        created: int,
        model: str,
        client_body: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(response_id=response_id, created=created, model=model)
        self._offset = 0  # where the next token's text starts in the whole output

    def start(self, usage: Usage | None = None) -> bytes | None:
        return None

    def delta(
        self, delta: ParsedDelta, usage: Usage | None = None, logprobs: Logprobs = None
    ) -> bytes | None:
        if not delta.content and not logprobs:
            return None
        return self._chunk(delta.content, None, None, usage, self._logprobs(logprobs))

    def finish(
        self,
        finish_reason: str,
        stop_reason: StopReason,
        usage: Usage | None = None,
        logprobs: Logprobs = None,
    ) -> bytes:
        return self._chunk("", finish_reason, stop_reason, usage, self._logprobs(logprobs or None))

    def response(
        self,
        message: ParsedMessage,
        finish_reason: str,
        stop_reason: StopReason,
        usage: Usage,
        logprobs: Logprobs = None,
    ) -> dict[str, Any]:
        choice = {
            "index": 0,
            "text": message.content or "",
            "logprobs": self._logprobs(logprobs),
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

    def _logprobs(self, entries: Logprobs) -> dict[str, Any] | None:
        """OpenAI's legacy shape; `text_offset` counts from the start of the output."""
        if entries is None:
            return None
        offsets = []
        for entry in entries:
            offsets.append(self._offset)
            self._offset += len(entry.token)
        return {
            "text_offset": offsets,
            "token_logprobs": [e.logprob for e in entries],
            "tokens": [e.token for e in entries],
            "top_logprobs": [dict(e.top) for e in entries],
        }

    def _chunk(
        self,
        text: str,
        finish_reason: str | None,
        stop_reason: StopReason,
        usage: Usage | None,
        logprobs: dict[str, Any] | None = None,
    ) -> bytes:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
        }
        return self._event(choice, usage)


def _chat_logprobs(entries: Logprobs) -> dict[str, Any] | None:
    if entries is None:
        return None
    return {
        "content": [
            {
                **_chat_token(entry.token, entry.logprob),
                "top_logprobs": [_chat_token(t, lp) for t, lp in entry.top],
            }
            for entry in entries
        ],
        "refusal": None,
    }


def _chat_token(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


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
