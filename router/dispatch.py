"""From an HTTP request to the path that serves it: parse, validate, route."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from router.errors import InvalidRequest, ModelNotFound
from router.openai.requests import Endpoint, parse_body, validate
from router.state import AppState


class Dispatcher:
    def __init__(self, state: AppState) -> None:
        self._state = state

    async def handle(self, request: Request, endpoint: Endpoint) -> Response:
        raw = await _read_body(request, self._state.config.server.max_body_bytes)
        body = parse_body(raw)
        parsed = validate(endpoint, body)
        # kv_transfer_params decides where KV state is written by RDMA: never the client's.
        body.pop("kv_transfer_params", None)
        model = self._state.config.model(parsed.model)
        pool = self._state.latency.get(parsed.model)
        if model is None or pool is None:
            raise ModelNotFound(f"the model '{parsed.model}' does not exist", param="model")
        gate = self._state.config.gate
        return await pool.serve(
            parsed,
            body,
            priority=gate.default_priority,
            wait_s=gate.max_queue_wait_ms / 1000,
            headers={"x-pd-route": "latency"},
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
