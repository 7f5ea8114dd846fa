"""Which prefill servers render chat prompts exactly as the gateway does.

Before a server gets token ids, its `POST /tokenize` renders a few canary conversations
(multi-turn, system prompt, unicode, tools with a call and its result, reasoning switched on
and off) and its ids must equal the gateway's for every one the gateway can render. A server
that differs, or has no /tokenize, gets text prompts (one warning, one metric); one that does
not answer is asked again on a later use. Proving runs in the background: until a server is
proven, its requests go as text.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from router.errors import UpstreamError
from router.latency.prompt_ids import PromptIds, rendered_chat
from router.telemetry.metrics import Metrics
from router.upstream import Upstreams, vllm

log = logging.getLogger("pd_gateway.latency")

RETRY_S = 30.0
"""A server that did not answer is asked again this long after, on its next use."""

_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
}

CANARIES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("one turn", {"messages": [{"role": "user", "content": "Hello there."}]}),
    (
        "system and history",
        {
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name a river."},
                {"role": "assistant", "content": "The Seine."},
                {"role": "user", "content": "Café, naïve, 速度 and 🌍: say them back."},
            ]
        },
    ),
    (
        "tools",
        {
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [_CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
                {"role": "user", "content": "And tomorrow?"},
            ],
            "tools": [_WEATHER, {"type": "function", "function": {"name": "now"}}],
        },
    ),
    (
        "reasoning on",
        {
            "messages": [
                {"role": "user", "content": "Think first."},
                {"role": "assistant", "content": "Done.", "reasoning": "Short."},
                {"role": "user", "content": "Again."},
            ],
            "chat_template_kwargs": {"enable_thinking": True},
        },
    ),
    (
        "reasoning off",
        {
            "messages": [{"role": "user", "content": "Answer at once."}],
            "chat_template_kwargs": {"enable_thinking": False},
        },
    ),
)


class TokenIdsProof:
    """One model's verdict per prefill server; `proven(url)` starts proving on first use."""

    def __init__(
        self, model: str, prompt_ids: PromptIds, upstreams: Upstreams, metrics: Metrics
    ) -> None:
        self._model = model
        self._prompt_ids = prompt_ids
        self._upstreams = upstreams
        self._metrics = metrics
        self._verdicts: dict[str, bool] = {}
        self._proving: dict[str, asyncio.Task[None]] = {}
        self._unanswered_at: dict[str, float] = {}

    def proven(self, url: str) -> bool:
        """Whether `url` may get token ids; if nobody knows yet, it is asked (in the
        background) and the answer is no for now."""
        verdict = self._verdicts.get(url)
        if verdict is None:
            self._start(url)
            return False
        return verdict

    def verdicts(self) -> dict[str, bool]:
        return dict(self._verdicts)

    def _start(self, url: str) -> None:
        if url in self._proving:
            return
        asked = self._unanswered_at.get(url)
        if asked is not None and time.monotonic() - asked < RETRY_S:
            return
        task = asyncio.create_task(self._prove(url))
        self._proving[url] = task
        task.add_done_callback(lambda _: self._proving.pop(url, None))

    async def prove(self, url: str) -> bool:
        """Prove `url` now (start-up, tests); its verdict, False while it does not answer."""
        await self._prove(url)
        return self._verdicts.get(url, False)

    async def _prove(self, url: str) -> None:
        try:
            verdict, detail = await self._compare(url)
        except UpstreamError as exc:
            self._unanswered_at[url] = time.monotonic()
            log.info(
                "prefill server %s: /tokenize did not answer (%s); asked again later", url, exc
            )
            return
        except Exception:  # a bug must not leave the server unproven forever, nor crash
            log.exception("proving prefill server %s's rendering failed", url)
            verdict, detail = "differs", "the comparison failed"
        self._verdicts[url] = verdict == "identical"
        self._metrics.token_ids_proof(self._model, url, verdict)
        if verdict == "identical":
            log.info("prefill server %s renders chat prompts as the gateway: token ids", url)
        else:
            log.warning(
                "model %s: prefill server %s gets text prompts, not token ids: %s",
                self._model,
                url,
                detail,
            )

    async def _compare(self, url: str) -> tuple[str, str]:
        compared = 0
        for name, canary in CANARIES:
            rendered = rendered_chat(canary)
            assert rendered is not None, name
            ours = await asyncio.to_thread(self._prompt_ids.ids_now, rendered)
            if ours is None:
                continue  # the model's template refuses it: such requests go as text anyway
            body = {"model": self._model, **canary, "add_generation_prompt": True}
            theirs = await vllm.tokenize(self._upstreams, url, body)
            if theirs is None:
                return "no_tokenize", "it has no /tokenize, or refused a canary conversation"
            if theirs != ours:
                return "differs", f"its rendering of the canary {name!r} differs"
            compared += 1
        if not compared:
            return "differs", "the model's chat template renders none of the canaries"
        return "identical", ""
