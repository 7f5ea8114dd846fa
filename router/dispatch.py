"""From an HTTP request to the path that serves it: parse, validate, classify, route.

Saturation and failures before the first byte on the latency path follow the matched
rule: `spill` re-routes to the throughput path (the client never sees the failure),
`reject` answers 429 at once when no slot is free, `queue` waits up to the budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Coroutine
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from policies import Decision
from policies.decision import REROUTE_HEADER, ROUTE_HEADER
from router.errors import (
    ClientGone,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    Overloaded,
    PrefillError,
    UpstreamError,
)
from router.openai.requests import ChatRequest, CompletionRequest, Endpoint, parse_body, validate
from router.state import AppState


class Dispatcher:
    def __init__(self, state: AppState) -> None:
        self._state = state

    async def handle(self, request: Request, endpoint: Endpoint) -> Response:
        state = self._state
        raw = await _read_body(request, state.config.server.max_body_bytes)
        body = parse_body(raw)
        parsed = validate(endpoint, body)
        # kv_transfer_params decides where KV state is written by RDMA: never the client's.
        body.pop("kv_transfer_params", None)
        if state.config.model(parsed.model) is None:
            raise ModelNotFound(f"the model '{parsed.model}' does not exist", param="model")
        request.state.model = parsed.model
        decision = await state.classifier.decide(body, endpoint=endpoint, headers=request.headers)
        headers = decision.response_headers()
        if decision.reroute_reason is not None:
            state.metrics.reroute(parsed.model, decision.reroute_reason.value)
        try:
            if decision.unavailable is not None:
                raise _unavailable(decision)
            if decision.path == "latency":
                return await self._latency(request, parsed, body, endpoint, decision, headers)
            return await self._throughput(body, endpoint, headers)
        except GatewayError as exc:
            exc.headers = {**headers, **exc.headers}
            raise

    async def _latency(
        self,
        request: Request,
        parsed: ChatRequest | CompletionRequest,
        body: dict[str, Any],
        endpoint: Endpoint,
        decision: Decision,
        headers: dict[str, str],
    ) -> Response:
        pool = self._state.latency[parsed.model]
        if decision.on_saturation == "reject":
            wait_s = 0.0
        else:
            wait_ms = decision.max_queue_wait_ms
            if wait_ms is None:
                wait_ms = self._state.config.gate.max_queue_wait_ms
            wait_s = wait_ms / 1000
        try:
            return await until_disconnected(
                request,
                pool.serve(
                    parsed, body, priority=decision.priority, wait_s=wait_s, headers=headers
                ),
            )
        except (Overloaded, UpstreamError) as exc:
            if isinstance(exc, UpstreamError):
                self._state.metrics.upstream_error(parsed.model, str(exc.code))
            if not (
                decision.on_saturation == "spill"
                and parsed.model in self._state.throughput
                and _spillable(exc)
            ):
                raise
            self._state.metrics.reroute(parsed.model, str(exc.code))
            spilled = {**headers, ROUTE_HEADER: "throughput", REROUTE_HEADER: str(exc.code)}
            return await self._throughput(body, endpoint, spilled)

    async def _throughput(
        self, body: dict[str, Any], endpoint: Endpoint, headers: dict[str, str]
    ) -> Response:
        path = self._state.throughput[body["model"]]
        return await path.serve(
            body, endpoint=endpoint, request_id=uuid.uuid4().hex, response_headers=headers
        )


async def until_disconnected(request: Request, work: Coroutine[Any, Any, Response]) -> Response:
    """Run `work` (the latency path up to its response) unless the client leaves first: then
    cancel it, which gives up its place in the queue or cancels its node and frees the slot.
    A streamed response watches for the client itself once it has started."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, GatewayError):
            await task
        raise ClientGone("the client closed the connection")
    return task.result()


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _spillable(exc: GatewayError) -> bool:
    """Saturation and upstream failures before the first byte, but not the client's own
    mistakes (a 4xx from the prefill server would fail on the throughput path too)."""
    if isinstance(exc, PrefillError):
        return exc.status >= 500
    return True


def _unavailable(decision: Decision) -> GatewayError:
    reason = decision.reroute_reason.value if decision.reroute_reason else decision.unavailable
    return InvalidRequest(
        f"this model has no {decision.path} path, which the request needs ({reason})",
        param=reason,
        code=decision.unavailable,
    )


async def _read_body(request: Request, limit: int) -> bytes:
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise InvalidRequest(f"the request body exceeds {limit} bytes", status=413)
        chunks.append(chunk)
    return b"".join(chunks)
