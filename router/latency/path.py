"""The latency path end to end: take a slot, run the session, answer in OpenAI's shape."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from router.balance import LeastOutstanding
from router.config import ModelConfig, TimeoutsConfig
from router.errors import GatewayError, Overloaded, sse_error_event
from router.gate import Gate, GateRejected
from router.latency.session import LatencySession, SessionEnd, Spawn
from router.metrics import Metrics
from router.openai.render import DONE_EVENT, Renderer, Usage, make_renderer
from router.openai.requests import ChatRequest, CompletionRequest
from router.responses import json_response
from router.tokenizer import LoadedTokenizer

log = logging.getLogger("pd_gateway.latency")

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class LatencyPool:
    """Everything one model needs on the latency path."""

    def __init__(
        self,
        *,
        model: ModelConfig,
        gate: Gate,
        tokenizer: LoadedTokenizer,
        http: httpx.AsyncClient,
        timeouts: TimeoutsConfig,
        spawn: Spawn,
        metrics: Metrics,
    ) -> None:
        assert model.latency is not None
        self.model = model
        self.gate = gate
        self._tokenizer = tokenizer
        self._http = http
        self._timeouts = timeouts
        self._spawn = spawn
        self._metrics = metrics
        self._prefill = LeastOutstanding(model.latency.prefill)
        self._live: set[LatencySession] = set()  # sessions whose slot is not yet released

    async def serve(
        self,
        request: ChatRequest | CompletionRequest,
        body: dict[str, Any],
        *,
        priority: int,
        wait_s: float,
        headers: dict[str, str],
    ) -> Response:
        rid = uuid.uuid4().hex  # dash-free: vLLM and the node reduce it to itself (§1.2)
        started = time.monotonic()
        try:
            lease = await self.gate.acquire(priority=priority, wait_s=wait_s, holder=rid)
        except GateRejected as exc:
            self._metrics.queue_wait(self.model.name, time.monotonic() - started, granted=False)
            raise Overloaded(
                _REJECTED[exc.reason], retry_after_s=exc.retry_after_s, code=exc.reason
            ) from None
        self._metrics.queue_wait(self.model.name, time.monotonic() - started, granted=True)
        url = self._prefill.pick()
        session = LatencySession(
            metrics=self._metrics,
            started=started,
            on_released=self._live.discard,
            rid=rid,
            http=self._http,
            timeouts=self._timeouts,
            spawn=self._spawn,
            lease=lease,
            prefill_url=url,
            model=self.model,
            tokenizer=self._tokenizer,
            request=request,
            body=body,
        )
        self._live.add(session)
        with self._prefill.hold(url):
            await session.start()
        assert session.prefill is not None
        renderer = make_renderer(
            isinstance(request, ChatRequest),
            response_id=session.prefill.response_id,
            created=session.prefill.created,
            model=self.model.name,
        )
        if request.stream:
            return SessionStream(
                session,
                _stream(session, renderer, include_usage=request.include_usage),
                media_type="text/event-stream",
                headers={**SSE_HEADERS, **headers},
            )
        end = SessionEnd("stop", 0)
        async for event in session.events():
            if isinstance(event, SessionEnd):
                end = event
        usage = _usage(session, end)
        return json_response(
            renderer.response(session.message(), end.finish_reason, usage), headers=headers
        )

    def close_all(self) -> None:
        """Shutdown: finish the protocol of every session still holding a slot (their
        requests may have been cut off before their own cleanup could start)."""
        for session in list(self._live):
            session.close()


class SessionStream(StreamingResponse):
    """A streamed answer that closes its session even if the body was never iterated (the
    client left before the response started): an unstarted generator has no `finally`."""

    def __init__(self, session: LatencySession, content: AsyncIterator[bytes], **kwargs: Any):
        super().__init__(content, **kwargs)
        self._session = session

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._session.close()


_REJECTED = {
    "queue_full": "all TileRT decode nodes are busy and the queue is full; retry later",
    "wait_timeout": "no TileRT decode node became free within the wait budget; retry later",
    "no_node": "no TileRT decode node is available; retry later",
}


def _usage(session: LatencySession, end: SessionEnd) -> Usage:
    assert session.prefill is not None
    return Usage(
        prompt_tokens=session.prefill.prompt_tokens,
        completion_tokens=end.completion_tokens,
        cached_tokens=session.prefill.cached_tokens,
    )


async def _stream(
    session: LatencySession, renderer: Renderer, *, include_usage: bool
) -> AsyncIterator[bytes]:
    first = renderer.start()
    if first:
        yield first
    try:
        async for event in session.events():
            if isinstance(event, SessionEnd):
                yield renderer.finish(event.finish_reason)
                if include_usage:
                    yield renderer.usage(_usage(session, event))
            elif chunk := renderer.delta(event):
                yield chunk
    except GatewayError as exc:
        session.record_error(exc)
        yield sse_error_event(exc)
    except Exception:  # a bug: the client still gets an error event and a clean end
        log.exception("relaying a latency stream failed")
        yield sse_error_event(GatewayError("internal error in the gateway"))
    yield DONE_EVENT
