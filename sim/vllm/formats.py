"""vLLM 0.32's OpenAI response bodies and stream chunks for chat and completions.

Key sets and order follow vLLM's: a whole answer lists every field (nulls included); a
stream chunk only the fields vLLM sets (``stop_reason`` only with the finish, the
``system_fingerprint`` on a choice's finishing chunk unless a usage chunk follows, which
then carries it). Logprobs follow ``--return-tokens-as-token-ids``: every token is named
``token_id:N`` (``text_logprobs`` names it by its text, as vLLM without that flag).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.ids import Endpoint
from sim.logprobs import token_logprob as _logprob
from sim.logprobs import top_candidates
from sim.tokenizers import Vocab
from sim.vllm.engine import Step
from sim.vllm.parsers import NativeParser

VLLM_VERSION = "0.32.0"


def system_fingerprint(model: str) -> str:
    """``vllm-<version>-<8 hex>``, fixed per served model."""
    return f"vllm-{VLLM_VERSION}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> dict[str, Any]:
    """The ``usage`` object of a whole answer (``cached_tokens`` None: no details)."""
    details = None if cached_tokens is None else {"cached_tokens": cached_tokens}
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": details,
        "completion_tokens_details": None,
    }


@dataclass(frozen=True, slots=True)
class Echo:
    """A completion's prompt, repeated before the output (``echo: true``)."""

    text: str
    ids: list[int]
    only: bool = False
    """``max_tokens: 0``: the prompt alone, without the generated token."""


@dataclass(slots=True)
class Formatter:
    """Builds the bodies of one response."""

    endpoint: Endpoint
    response_id: str
    model: str
    created: int
    vocab: Vocab
    logprobs: int | None
    text_logprobs: bool
    parsers: list[NativeParser | None] = field(default_factory=lambda: [None])
    """Per choice, chat with ``--reasoning-parser`` / ``--tool-call-parser``."""
    echoes: list[Echo] | None = None
    """Per choice, completions with ``echo: true``."""
    include_usage: bool = False
    fingerprint: str = ""
    prompt_ids: list[list[int]] | None = None
    """Per choice, the prompt's ids, with ``return_token_ids`` (the output's ids then too)."""

    def _prompt_ids_of(self, index: int) -> list[int] | None:
        return None if self.prompt_ids is None else self.prompt_ids[index]

    def _token_ids(self, steps: Sequence[Step]) -> list[int] | None:
        return None if self.prompt_ids is None else [s.token_id for s in steps]

    @property
    def parser(self) -> NativeParser | None:
        """The first choice's parser (all choices parse alike)."""
        return self.parsers[0] if self.parsers else None

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

    def _completion_logprobs(
        self, steps: Sequence[Step], offset: int, prompt_ids: Sequence[int] = ()
    ) -> dict[str, Any] | None:
        """Logprobs of (echoed prompt ids and) steps; the prompt's first token has none."""
        if self.logprobs is None:
            return None
        offsets: list[int] = []
        values: list[float | None] = []
        tokens: list[str] = []
        tops: list[dict[str, float] | None] = []
        for position, token_id in enumerate(prompt_ids):
            name = self._name(token_id)
            offsets.append(offset)
            offset += len(self.vocab.decode([token_id]))
            tokens.append(name)
            values.append(None if position == 0 else _logprob(token_id, 0))
            tops.append(None if position == 0 else dict(self._alternatives(token_id)))
        for step in steps:
            offsets.append(offset)
            offset += len(step.text)
            tokens.append(self._name(step.token_id))
            values.append(_logprob(step.token_id, 0))
            tops.append(dict(self._alternatives(step.token_id)))
        return {
            "text_offset": offsets,
            "token_logprobs": values,
            "tokens": tokens,
            "top_logprobs": tops,
        }

    def _echo(self, index: int) -> Echo | None:
        return None if self.echoes is None else self.echoes[index]

    def _prompt_logprobs(self, index: int) -> list[dict[str, Any] | None] | None:
        """vLLM's ``prompt_logprobs`` of an echoed prompt with logprobs."""
        echo = self._echo(index)
        if echo is None or self.logprobs is None:
            return None
        entries: list[dict[str, Any] | None] = [None]
        for token_id in echo.ids[1:]:
            candidates = top_candidates(token_id, max(self.logprobs, 1))
            entries.append(
                {
                    str(t): {
                        "logprob": lp,
                        "rank": rank,
                        "decoded_token": self.vocab.decode([t]),
                    }
                    for rank, (t, lp) in enumerate(candidates, start=1)
                }
            )
        return entries

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.response_id, "object": obj, "created": self.created, "model": self.model}

    def _chat_message(self, index: int, steps: Sequence[Step]) -> tuple[dict[str, Any], str]:
        text = "".join(s.text for s in steps)
        finish = steps[-1].finish_reason if steps else "length"
        message: dict[str, Any] = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        }
        parser = self.parsers[index]
        if parser is not None:
            for step in steps:
                parser.feed(step.text)
            parser.finish()
            reasoning, content, calls = parser.message()
            message = {
                "role": "assistant",
                "content": content,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "tool_calls": calls,
                "reasoning": reasoning,
                # The parsers' own field name, kept beside vLLM's.
                "reasoning_content": reasoning,
            }
            finish = parser.finish_reason(finish) or finish
        return message, finish or "length"

    def response(
        self,
        choices: Sequence[Sequence[Step]],
        usage_body: dict[str, Any],
        kv: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """The non-streaming response body, one choice per list of steps."""
        if self.endpoint == "chat":
            bodies = []
            for index, steps in enumerate(choices):
                message, finish = self._chat_message(index, steps)
                bodies.append(
                    {
                        "index": index,
                        "message": message,
                        "logprobs": self._chat_logprobs(steps),
                        "finish_reason": finish,
                        "stop_reason": steps[-1].stop_reason if steps else None,
                        "token_ids": self._token_ids(steps),
                        "routed_experts": None,
                    }
                )
            return {
                **self._head("chat.completion"),
                "choices": bodies,
                "service_tier": None,
                "system_fingerprint": self.fingerprint,
                "usage": usage_body,
                "prompt_logprobs": None,
                "prompt_token_ids": self._prompt_ids_of(0),
                "prompt_text": None,
                "kv_transfer_params": kv,
                "ec_transfer_params": None,
                "metrics": None,
            }
        bodies = [self._completion_choice(index, steps) for index, steps in enumerate(choices)]
        return {
            **self._head("text_completion"),
            "choices": bodies,
            "service_tier": None,
            "system_fingerprint": self.fingerprint,
            "usage": usage_body,
            "kv_transfer_params": kv,
            "ec_transfer_params": None,
            "metrics": None,
        }

    def _completion_choice(self, index: int, steps: Sequence[Step]) -> dict[str, Any]:
        echo = self._echo(index)
        shown = [] if echo is not None and echo.only else list(steps)
        text = "".join(s.text for s in shown)
        prompt_ids: list[int] = []
        if echo is not None:
            text, prompt_ids = echo.text + text, echo.ids
        return {
            "index": index,
            "text": text,
            "logprobs": self._completion_logprobs(shown, 0, prompt_ids),
            "finish_reason": steps[-1].finish_reason if steps else "length",
            "stop_reason": steps[-1].stop_reason if steps else None,
            "token_ids": self._token_ids(steps),
            "prompt_logprobs": self._prompt_logprobs(index),
            "prompt_token_ids": self._prompt_ids_of(index),
            "routed_experts": None,
        }

    def role_chunk(self, index: int = 0) -> dict[str, Any]:
        """A chat choice's first chunk, announcing the assistant role."""
        delta = {"role": "assistant", "content": ""}
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        return {**self._head("chat.completion.chunk"), "choices": [choice]}

    def with_prompt_fields(self, chunk: dict[str, Any]) -> dict[str, Any]:
        """A chat role chunk ends with vLLM's ``prompt_token_ids`` and ``prompt_text``."""
        return {**chunk, "prompt_token_ids": self._prompt_ids_of(0), "prompt_text": None}

    def chunk(
        self, step: Step, text_offset: int, index: int = 0, first: bool = False
    ) -> dict[str, Any]:
        """The stream chunk carrying one step of choice ``index`` (``first``: its first)."""
        if self.endpoint == "chat":
            parser = self.parsers[index]
            delta = {"content": step.text} if parser is None else self._parsed_delta(step, parser)
            choice: dict[str, Any] = {
                "index": index,
                "delta": delta,
                "logprobs": self._chat_logprobs([step]),
                "finish_reason": None,
            }
            if step.finish_reason is not None:
                finish = step.finish_reason
                if parser is not None:
                    finish = parser.finish_reason(finish) or finish
                choice.update(finish_reason=finish, stop_reason=step.stop_reason)
            choice["token_ids"] = self._token_ids([step])
            chunk = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            chunk = {
                **self._head("text_completion"),
                "choices": [self._completion_chunk_choice(step, text_offset, index, first)],
            }
        if step.finish_reason is not None and not self.include_usage:
            chunk["system_fingerprint"] = self.fingerprint
        return chunk

    def _completion_chunk_choice(
        self, step: Step, text_offset: int, index: int, first: bool
    ) -> dict[str, Any]:
        echo = self._echo(index) if first else None
        text, prompt_ids, shown = step.text, [], [step]
        if echo is not None:
            prompt_ids = echo.ids
            text = echo.text if echo.only else echo.text + step.text
            shown = [] if echo.only else [step]
        return {
            "index": index,
            "text": text,
            "logprobs": self._completion_logprobs(shown, text_offset, prompt_ids),
            "finish_reason": step.finish_reason,
            "stop_reason": step.stop_reason,
            "prompt_token_ids": prompt_ids or (self._prompt_ids_of(index) if first else None),
            "token_ids": self._token_ids(shown),
        }

    def _parsed_delta(self, step: Step, parser: NativeParser) -> dict[str, Any]:
        """The parsed delta of one step (the last one flushes what was held back)."""
        parts = [parser.feed(step.text)]
        if step.finish_reason is not None:
            parts.append(parser.finish())
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
        counts = {k: v for k, v in usage_body.items() if v is not None}
        return {
            **self._head(obj),
            "choices": [],
            "usage": counts,
            "system_fingerprint": self.fingerprint,
        }
