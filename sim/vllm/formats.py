"""vLLM's OpenAI response bodies and stream chunks for chat and completions.

Logprobs follow ``--return-tokens-as-token-ids``: every token is named ``token_id:N``
(the ``text_logprobs`` fault names it by its text instead, like a misconfigured server).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sim.ids import Endpoint
from sim.logprobs import token_logprob as _logprob
from sim.logprobs import top_candidates
from sim.tokenizers import Vocab
from sim.vllm.engine import Step
from sim.vllm.parsers import NativeParser


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """The ``usage`` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


@dataclass(frozen=True, slots=True)
class Formatter:
    """Builds the bodies of one response."""

    endpoint: Endpoint
    response_id: str
    model: str
    created: int
    vocab: Vocab
    logprobs: int | None
    text_logprobs: bool
    parser: NativeParser | None = None
    """Chat with ``--reasoning-parser`` / ``--tool-call-parser``: the message is parsed."""

    def _name(self, token_id: int) -> str:
        if self.text_logprobs:
            return self.vocab.decode([token_id])
        return f"token_id:{token_id}"

    def _alternatives(self, token_id: int) -> list[tuple[str, float]]:
        return [(self._name(t), lp) for t, lp in top_candidates(token_id, self.logprobs or 0)]

    def _chat_logprobs(self, steps: Sequence[Step]) -> dict[str, Any] | None:
        if self.logprobs is None:
            return None
        content = []
        for step in steps:
            name = self._name(step.token_id)
            content.append(
                {
                    "token": name,
                    "logprob": _logprob(step.token_id, 0),
                    "bytes": list(name.encode("utf-8")),
                    "top_logprobs": [
                        {"token": alt, "logprob": lp, "bytes": list(alt.encode("utf-8"))}
                        for alt, lp in self._alternatives(step.token_id)
                    ],
                }
            )
        return {"content": content}

    def _completion_logprobs(self, steps: Sequence[Step], offset: int) -> dict[str, Any] | None:
        if self.logprobs is None:
            return None
        offsets = []
        for step in steps:
            offsets.append(offset)
            offset += len(step.text)
        return {
            "text_offset": offsets,
            "token_logprobs": [_logprob(s.token_id, 0) for s in steps],
            "tokens": [self._name(s.token_id) for s in steps],
            "top_logprobs": [dict(self._alternatives(s.token_id)) for s in steps],
        }

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.response_id, "object": obj, "created": self.created, "model": self.model}

    def response(
        self, steps: Sequence[Step], usage_body: dict[str, Any], kv: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The non-streaming response body."""
        text = "".join(s.text for s in steps)
        last = steps[-1] if steps else None
        finish = last.finish_reason if last else "length"
        stop_reason = last.stop_reason if last else None
        if self.endpoint == "chat":
            message: dict[str, Any] = {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "tool_calls": [],
                "reasoning_content": None,
            }
            if self.parser is not None:
                for step in steps:
                    self.parser.feed(step.text)
                self.parser.finish()
                reasoning, content, calls = self.parser.message()
                # vLLM renamed reasoning_content to reasoning and keeps both in sync.
                message.update(content=content, tool_calls=calls, reasoning=reasoning)
                message["reasoning_content"] = reasoning
                finish = self.parser.finish_reason(finish)
            choice = {
                "index": 0,
                "message": message,
                "logprobs": self._chat_logprobs(steps),
                "finish_reason": finish,
                "stop_reason": stop_reason,
            }
            return {
                **self._head("chat.completion"),
                "choices": [choice],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": usage_body,
                "prompt_logprobs": None,
                "kv_transfer_params": kv,
            }
        choice = {
            "index": 0,
            "text": text,
            "logprobs": self._completion_logprobs(steps, 0),
            "finish_reason": finish,
            "stop_reason": stop_reason,
            "prompt_logprobs": None,
        }
        return {
            **self._head("text_completion"),
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage_body,
            "kv_transfer_params": kv,
        }

    def role_chunk(self) -> dict[str, Any]:
        """The first chat chunk, announcing the assistant role."""
        delta = {"role": "assistant", "content": ""}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return {**self._head("chat.completion.chunk"), "choices": [choice]}

    def chunk(self, step: Step, text_offset: int) -> dict[str, Any]:
        """The stream chunk carrying one step."""
        if self.endpoint == "chat":
            delta = {"content": step.text} if self.parser is None else self._parsed_delta(step)
            finish = step.finish_reason
            if self.parser is not None:
                finish = self.parser.finish_reason(finish)
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": self._chat_logprobs([step]),
                "finish_reason": finish,
                "stop_reason": step.stop_reason,
            }
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {
            "index": 0,
            "text": step.text,
            "logprobs": self._completion_logprobs([step], text_offset),
            "finish_reason": step.finish_reason,
            "stop_reason": step.stop_reason,
        }
        return {**self._head("text_completion"), "choices": [choice]}

    def _parsed_delta(self, step: Step) -> dict[str, Any]:
        """The parsed delta of one step (the last one flushes what was held back)."""
        assert self.parser is not None
        parts = [self.parser.feed(step.text)]
        if step.finish_reason is not None:
            parts.append(self.parser.finish())
        delta: dict[str, Any] = {}
        for part in parts:
            if "reasoning" in part:
                reasoning = delta.get("reasoning", "") + part["reasoning"]
                delta.update(reasoning=reasoning, reasoning_content=reasoning)
            if "content" in part:
                delta["content"] = delta.get("content", "") + part["content"]
            if "tool_calls" in part:
                delta.setdefault("tool_calls", []).extend(part["tool_calls"])
        return delta

    def usage_chunk(self, usage_body: dict[str, Any]) -> dict[str, Any]:
        """The trailing ``choices: []`` chunk of ``stream_options.include_usage``."""
        obj = "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage_body}
