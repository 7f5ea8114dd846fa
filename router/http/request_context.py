"""Per API request: its id, its access record, and its count in the metrics.

The id is the client's `X-Request-Id` when it is a reasonable one (printable, at most 128
characters), else a fresh one; it is returned on every response, errors included, and
named by every log line written for the request. The access record is one structured
log line per request, filled in along the way (`AccessRecord`) and written when the
response ends, however it ends; a routed request's duration and tokens are read off it
into the metrics as its last bytes are sent (or when it ends without them). Every API
answer is counted by model, path, rule and status as it starts, read off the decision
headers, so errors rendered anywhere and lazily relayed answers are counted alike.
"""

from __future__ import annotations

import logging
import re
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.openai.endpoints import ENDPOINTS, endpoint_at
from router.serving.base import new_request_id
from router.telemetry.access import AccessRecord
from router.telemetry.logs import request_id
from router.telemetry.metrics import Metrics, key_label
from router.telemetry.tracing import finish_request, request_span

log = logging.getLogger("pd_gateway.access")

API_PATHS = frozenset(endpoint.path for endpoint in ENDPOINTS.values())
_VALID_ID = re.compile(rb"[\x21-\x7e]{1,128}")  # visible ASCII, no spaces


class RequestContext:
    """ASGI middleware: the request id on the way in and out, the access line at the end."""

    def __init__(self, app: ASGIApp, *, access_log: bool = True) -> None:
        self.app = app
        self._access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        api = scope["path"] in API_PATHS
        rid = _client_id(scope) or new_request_id()
        token = request_id.set(rid)
        record = AccessRecord(rid, client=_client_address(scope))
        scope.setdefault("state", {})["access"] = record
        started = time.monotonic()
        completed = False
        header = (b"x-request-id", rid.encode())

        def ended() -> None:
            record.duration_ms = round((time.monotonic() - started) * 1e3, 3)
            if api and record.path:
                _measure(scope, record)

        async def send_with_id(message: Message) -> None:
            nonlocal completed
            if message["type"] == "http.response.start":
                record.status = message["status"]
                _read_decision(record, message)
                if api:
                    _count(scope, record)
                message = {**message, "headers": [*message.get("headers", ()), header]}
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                # Measured before the last bytes leave, so that a client that has them
                # finds the request in the metrics.
                completed = True
                ended()
            await send(message)

        traced = request_span(scope["method"], scope["path"], scope["headers"]) if api else None
        try:
            if traced is None:
                await self.app(scope, receive, send_with_id)
            else:
                with traced as span:
                    try:
                        await self.app(scope, receive, send_with_id)
                    finally:
                        finish_request(span, record)
        finally:
            record.client_gone = not completed or record.status == 499
            if not completed:
                ended()
            if self._access_log and api:
                log.info(
                    "%s %s %s",
                    scope["method"],
                    scope["path"],
                    record.status,
                    extra={"access": record.to_dict()},
                )
            request_id.reset(token)


def _client_id(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            return value.decode("ascii") if _VALID_ID.fullmatch(value) else None
    return None


def _client_address(scope: Scope) -> str | None:
    client = scope.get("client")
    return client[0] if client else None


def _measure(scope: Scope, record: AccessRecord) -> None:
    state = getattr(scope["app"].state, "gateway", None)
    if state is not None:
        key = key_label(record.key_name, state.epoch.keys.client.names)
        state.metrics.answered(record, key)
        if record.tenant is not None:
            state.metrics.tenant_answered(record, state.tenants.label(record.tenant))


def _count(scope: Scope, record: AccessRecord) -> None:
    metrics: Metrics | None = getattr(getattr(scope["app"].state, "gateway", None), "metrics", None)
    if metrics is not None and record.status is not None:
        spec = endpoint_at(scope["path"])
        endpoint = spec.name if spec is not None else "other"
        metrics.request(
            record.model or "", endpoint, record.path or "", record.rule or "", record.status
        )


def _read_decision(record: AccessRecord, message: Message) -> None:
    for name, value in message.get("headers", ()):
        if name == b"x-pd-route":
            record.path = value.decode("latin-1")
        elif name == b"x-pd-rule":
            record.rule = value.decode("latin-1")
        elif name == b"x-pd-reroute-reason":
            record.reroute_reason = value.decode("latin-1")
