"""The node's HTTP API (PROTOCOLS.md §1.4) and its test-only ``/sim/`` endpoints."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from sim.faults import FaultError
from sim.tilert.decoder import DIED, DecodeSession
from sim.tilert.node import DecodeRequest, Node, Rejection
from sim.tilert.records import DecodeRecord


class NodeDiedError(RuntimeError):
    """Raised inside a streaming response to drop the connection without a final line."""


class NdjsonStream:
    """ASGI response relaying a session's lines; marks the body ended however it ends."""

    def __init__(self, session: DecodeSession, on_end: Callable[[], None]) -> None:
        self._session = session
        self._on_end = on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"application/x-ndjson")]
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            while True:
                line = await self._session.lines.get()
                if line is None:
                    break
                if line is DIED:
                    raise NodeDiedError("simulated node death mid-stream")
                await send({"type": "http.response.body", "body": line, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self._on_end()


def _json(status: int, body: dict[str, Any], on_end: Callable[[], None] | None = None) -> Response:
    task = BackgroundTask(on_end) if on_end is not None else None
    return JSONResponse(body, status_code=status, background=task)


async def _body(request: Request) -> dict[str, Any]:
    data = orjson.loads(await request.body() or b"{}")
    if not isinstance(data, dict):
        raise ValueError("body must be a JSON object")
    return data


def build_app(node: Node) -> Starlette:
    """The Starlette app serving ``node``."""

    def ender(
        session: DecodeSession | None, record: DecodeRecord, status: int
    ) -> Callable[[], None]:
        def end() -> None:
            record.status = status
            if session is not None:
                record.n = len(session.token_ids)
                record.finish_reason = session.finish_reason
                session.body_ended()
            node.records.decode_end(record)

        return end

    async def decode(request: Request) -> Any:
        try:
            body = DecodeRequest.model_validate(await _body(request))
        except (ValueError, ValidationError) as exc:
            return _json(400, {"error": f"invalid request: {exc}"})
        record = node.records.decode_begin(body.rid, body.stream, body.model_dump())
        session = node.begin(body, record)
        if isinstance(session, Rejection):
            return _json(session.status, session.body, ender(None, record, session.status))
        rejection = await node.start(session, body)
        if rejection is not None:
            return _json(rejection.status, rejection.body, ender(session, record, rejection.status))
        if body.stream:
            return NdjsonStream(session, ender(session, record, 200))
        await session.finished()
        end = ender(session, record, 200)
        if session.finish_reason == "died":
            end()
            raise NodeDiedError("simulated node death")
        if session.finish_reason == "error":
            return _json(500, {"error": "decode stalled", "rid": body.rid}, end)
        return _json(200, Node.result_body(session), end)

    async def cancel(request: Request) -> Response:
        rid = str((await _body(request)).get("rid", ""))
        if node.cancel(rid):
            return _json(200, {"cancelled": rid})
        return _json(404, {"error": "not_found", "rid": rid})

    async def health(request: Request) -> Response:
        return _json(200, {"status": "ok"})

    async def decode_status(request: Request) -> Response:
        return _json(200, node.status())

    async def records(request: Request) -> Response:
        return _json(200, node.records.to_json())

    async def faults(request: Request) -> Response:
        if request.method == "DELETE":
            node.faults.clear()
        elif request.method == "POST":
            values = await _body(request)
            count = values.pop("count", None)
            try:
                node.faults.arm(values, count)
            except FaultError as exc:
                return _json(400, {"error": str(exc)})
        return _json(200, {"faults": node.faults.snapshot()})

    async def reset(request: Request) -> Response:
        node.reset()
        return _json(200, {"reset": True})

    return Starlette(
        routes=[
            Route("/pd/decode", decode, methods=["POST"]),
            Route("/pd/cancel", cancel, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/decode_status", decode_status, methods=["GET"]),
            Route("/sim/records", records, methods=["GET"]),
            Route("/sim/faults", faults, methods=["GET", "POST", "DELETE"]),
            Route("/sim/reset", reset, methods=["POST"]),
        ]
    )
