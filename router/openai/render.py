"""Renders the decode relay's output as OpenAI responses: SSE chunks while streaming, one
JSON at the end.

One renderer per endpoint; both share the same small interface so the latency path never
branches on the endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
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

    def _counts(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "completion_tokens": self.completion_tokens,
        }

    def _details(self) -> dict[str, Any] | None:
        # vLLM reports them only when its prefix cache counted (--enable-prompt-tokens-details).
        return None if self.cached_tokens is None else {"cached_tokens": self.cached_tokens}

    def as_dict(self) -> dict[str, Any]:
        """In a whole answer: every field, null where there is nothing to say."""
        # The reasoning-token count vLLM puts in completion_tokens_details needs the
        # reasoning's own token count, which the relay does not keep: null, as vLLM
        # sends it for a model without a reasoning parser.
        return {
            **self._counts(),
            "prompt_tokens_details": self._details(),
            "completion_tokens_details": None,
        }

    def final_chunk(self) -> dict[str, Any]:
        """On a stream's usage chunk, which vLLM sends without its null fields."""
        details = self._details()
        if details is None:
            return self._counts()
        return {**self._counts(), "prompt_tokens_details": details}

    def running(self, *, chat: bool) -> dict[str, Any]:
        """On every chunk (`continuous_usage_stats`): chat names its completion details."""
        return {**self._counts(), "completion_tokens_details": None} if chat else self._counts()


@dataclass(frozen=True, slots=True)
class AnswerFacts:
    """What an answer carries beyond the output, as the prefill's answer (a real vLLM
    request for the same prompt) and the resolved request tell it."""

    system_fingerprint: str | None = None
    """vLLM's `vllm-<version>-<hash>`, from the prefill server's answer."""
    include_usage: bool = False
    """`stream_options.include_usage`: the fingerprint rides on the usage chunk, not the
    finishing one."""
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    """The sampling the output was generated with (the Responses object reports them)."""
    service_tier: str | None = None
    """The tier that served it, for a client that asked for one (vLLM says none)."""


StopReason = str | int | None
"""What ended the output, as vLLM reports it: the stop string or stop token id that matched,
None for EOS or the length limit."""


@dataclass(frozen=True, slots=True)
class AnswerHead:
    """What every rendering of one answer starts from."""

    response_id: str
    created: int
    model: str
    client_body: Mapping[str, Any] = field(default_factory=dict)
    """The request as the client sent it (the Responses object echoes its settings)."""
    facts: AnswerFacts = field(default_factory=lambda: AnswerFacts())


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


class _Base:
    object_chunk = ""
    chat = False

    def __init__(self, head: AnswerHead) -> None:
        self._head = {
            "id": head.response_id,
            "object": self.object_chunk,
            "created": head.created,
            "model": head.model,
        }
        self._chunk_head = dict(self._head)
        if head.facts.service_tier is not None:
            # vLLM's chunks carry none; to a client that named a tier, OpenAI's carry it.
            self._chunk_head["service_tier"] = head.facts.service_tier
        self._facts = head.facts

    def usage(self, usage: Usage) -> bytes:
        chunk = {**self._chunk_head, "choices": [], "usage": usage.final_chunk()}
        if self._facts.system_fingerprint is not None:
            chunk["system_fingerprint"] = self._facts.system_fingerprint
        return sse(chunk)

    def error(self, error: GatewayError) -> bytes:
        return error_event(error)

    def end(self) -> bytes:
        return DONE_EVENT

    def _event(
        self, choice: dict[str, Any], usage: Usage | None, *, last: bool = False, **top: Any
    ) -> bytes:
        """One chunk; `last`: the finishing one, which carries the fingerprint unless the
        usage chunk comes after it; `top`: fields after `usage` (the opening chunk's)."""
        chunk: dict[str, Any] = {**self._chunk_head, "choices": [choice]}
        if usage is not None:
            chunk["usage"] = usage.running(chat=self.chat)
        fingerprint = self._facts.system_fingerprint
        if last and fingerprint is not None and not self._facts.include_usage:
            chunk["system_fingerprint"] = fingerprint
        return sse({**chunk, **top})

    def _whole(self, obj: str, choice: dict[str, Any], usage: Usage) -> dict[str, Any]:
        return {
            **self._head,
            "object": obj,
            "choices": [choice],
            "service_tier": self._facts.service_tier,
            "system_fingerprint": self._facts.system_fingerprint,
            "usage": usage.as_dict(),
        }


class ChatRenderer(_Base):
    object_chunk = "chat.completion.chunk"
    chat = True

    def start(self, usage: Usage | None = None) -> bytes | None:
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return self._event(choice, usage, prompt_token_ids=None, prompt_text=None)

    def delta(
        self, delta: ParsedDelta, usage: Usage | None = None, logprobs: Logprobs = None
    ) -> bytes | None:
        out: dict[str, Any] = {}
        if delta.content:
            out["content"] = delta.content
        if delta.reasoning:
            out["reasoning"] = delta.reasoning
        if delta.tool_calls:
            out["tool_calls"] = [_tool_call_delta(c) for c in delta.tool_calls]
        if not out and not logprobs:
            return None
        choice = {
            "index": 0,
            "delta": out,
            "logprobs": _chat_logprobs(logprobs),
            "finish_reason": None,
            "token_ids": None,
        }
        return self._event(choice, usage)

    def finish(
        self,
        finish_reason: str,
        stop_reason: StopReason,
        usage: Usage | None = None,
        logprobs: Logprobs = None,
    ) -> bytes:
        choice = {
            "index": 0,
            "delta": {},
            "logprobs": _chat_logprobs(logprobs or None),
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
            "token_ids": None,
        }
        return self._event(choice, usage, last=True)

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
        if message.tool_calls:  # vLLM leaves the key out when there are none
            msg["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in message.tool_calls
            ]
        msg["reasoning"] = message.reasoning
        choice = {
            "index": 0,
            "message": msg,
            "logprobs": _chat_logprobs(logprobs),
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
            "token_ids": None,
            "routed_experts": None,
        }
        return {
            **self._whole("chat.completion", choice, usage),
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            **_TRANSFER_FIELDS,
        }


# What vLLM's answers end with: the transfer parameters of a disaggregated request (the
# latency path's client made none) and per-request metrics (off unless enabled).
_TRANSFER_FIELDS: dict[str, Any] = {
    "kv_transfer_params": None,
    "ec_transfer_params": None,
    "metrics": None,
}


class CompletionRenderer(_Base):
    object_chunk = "text_completion"

    def __init__(self, head: AnswerHead) -> None:
        super().__init__(head)
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
            "token_ids": None,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "routed_experts": None,
        }
        return {**self._whole("text_completion", choice, usage), **_TRANSFER_FIELDS}

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
            "prompt_token_ids": None,
            "token_ids": None,
        }
        return self._event(choice, usage, last=finish_reason is not None)


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
        ]
    }


def _chat_token(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def _tool_call_delta(call: Any) -> dict[str, Any]:
    """vLLM's order (id, type, index, function), with only the fields the delta sets."""
    out: dict[str, Any] = {}
    if call.id is not None:
        out["id"] = call.id
        out["type"] = "function"
    out["index"] = call.index
    function: dict[str, Any] = {}
    if call.name is not None:
        function["name"] = call.name
    if call.arguments:
        function["arguments"] = call.arguments
    out["function"] = function
    return out
