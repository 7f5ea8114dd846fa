"""Faults that make a whole server slow or unavailable, applied before any route.

``slow_ms`` delays every answer but the test endpoints; ``health_503`` answers ``/health``
with an empty 503 (as vLLM does once its engine is dead) and every ``/v1/`` call with a
503 error body. ``/metrics`` and ``/sim/`` keep answering so tests can watch and heal.
"""

from __future__ import annotations

import asyncio

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from sim.faults import FaultBoard
from sim.vllm.errors import error_body


class Availability:
    """ASGI wrapper applying the server-wide faults of ``faults`` to ``app``."""

    def __init__(self, app: ASGIApp, faults: FaultBoard) -> None:
        self._app = app
        self._faults = faults

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not path or path.startswith("/sim/"):
            await self._app(scope, receive, send)
            return
        delay_ms = self._faults.take("slow_ms", float)
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        if (path == "/health" or path.startswith("/v1/")) and self._faults.take("health_503", bool):
            body = b"" if path == "/health" else _unavailable_body()
            headers = [(b"content-length", str(len(body)).encode())]
            if body:
                headers.append((b"content-type", b"application/json"))
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self._app(scope, receive, send)


def _unavailable_body() -> bytes:
    return orjson.dumps(error_body(503, "The engine is unavailable (simulated)."))
