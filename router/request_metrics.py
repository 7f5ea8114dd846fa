"""Counts every answered API request by model, path, rule and status, read off the
response as it starts (the `x-pd-route` / `x-pd-rule` headers the dispatcher set), so
errors rendered anywhere and lazily relayed answers are counted alike."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.endpoints import ENDPOINTS
from router.metrics import Metrics

API_PATHS = frozenset(endpoint.path for endpoint in ENDPOINTS.values())


class RequestMetrics:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in API_PATHS:
            await self.app(scope, receive, send)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                _count(scope, message)
            await send(message)

        await self.app(scope, receive, counting_send)


def _count(scope: Scope, message: Message) -> None:
    metrics: Metrics | None = getattr(getattr(scope["app"].state, "gateway", None), "metrics", None)
    if metrics is None:
        return
    headers = dict(message.get("headers") or [])
    model = scope.get("state", {}).get("model", "")
    path = headers.get(b"x-pd-route", b"").decode("latin-1")
    rule = headers.get(b"x-pd-rule", b"").decode("latin-1")
    metrics.request(model, path, rule, message["status"])
