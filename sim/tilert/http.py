"""The node's HTTP API (docs/protocols.md §1.4–1.6) and its test-only ``/sim/`` endpoints."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, Literal

import orjson
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from sim.faults import FaultError
from sim.logprobs import token_logprob, top_candidates
from sim.tilert.config import CAPABILITIES
from sim.tilert.decoder import DIED, DecodeSession, Ending
from sim.tilert.node import DecodeRequest, Node, Rejection
from sim.tilert.records import DecodeRecord


class NodeDiedError(RuntimeError):
    """Raised inside a streaming response to drop the connection without a final line."""


class _Marker(enum.Enum):
    MORE = enum.auto()


_MORE: Final = _Marker.MORE
_Next = Ending | Literal[_Marker.MORE]  # what follows a write: the session's end, or _MORE


def _logprobs(ids: list[int], top: int) -> dict[str, Any]:
    """``lp`` (one float per token) and ``tp`` (per token, [id, logprob] pairs best first)."""
    return {
        "lp": [token_logprob(t) for t in ids],
        "tp": [[[c, lp] for c, lp in top_candidates(t, top)] for t in ids],
    }


class NdjsonStream:
    """ASGI response relaying a session's output; marks the body ended however it ends.

    0.1.5 writes each step's tokens as they come. 0.1.6 writes the first token on a line
    of its own, then batches: whatever is ready at once, then every ``interval_s``.
    """

    def __init__(
        self,
        session: DecodeSession,
        record: DecodeRecord,
        on_end: Callable[[], None],
        batched: bool,
        interval_s: float,
        top_logprobs: int | None,
    ) -> None:
        self._session = session
        self._record = record
        self._on_end = on_end
        self._batched = batched
        self._interval = interval_s
        self._top = top_logprobs
        self._pending: list[int] = []

    def _line(self, ids: list[int]) -> bytes:
        line: dict[str, Any] = {"t": ids}
        if self._top is not None:
            line |= _logprobs(ids, self._top)
        return orjson.dumps(line) + b"\n"

    async def _items(self) -> AsyncIterator[tuple[list[int], _Next]]:
        """(token ids to write now, the final item or _MORE), as the version paces them."""
        queue = self._session.lines
        if not self._batched:
            while isinstance(item := await queue.get(), list):
                yield item, _MORE
            yield [], item
            return
        first = await queue.get()
        if not isinstance(first, list):
            yield [], first
            return
        yield first[:1], _MORE
        pending = first[1:]
        loop = asyncio.get_running_loop()
        deadline: float | None = None  # what is ready right after the first line goes at once
        while True:
            final: _Next = _MORE
            while final is _MORE and not queue.empty():
                got = queue.get_nowait()
                final = _collect(got, pending)
            if final is _MORE and deadline is not None:
                try:
                    async with asyncio.timeout_at(deadline):
                        while final is _MORE:
                            got = await queue.get()
                            final = _collect(got, pending)
                except TimeoutError:
                    pass
            yield pending, final
            if final is not _MORE:
                return
            pending = []
            deadline = loop.time() + self._interval

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"application/x-ndjson")]
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            async for ids, final in self._items():
                if ids:
                    body = self._line(ids)
                    # Noted before the write: no reader can see the line earlier.
                    self._record.line_writes.append(time.time())
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                if final is _MORE:
                    continue
                if final is DIED:
                    raise NodeDiedError("simulated node death mid-stream")
                if isinstance(final, dict):
                    body = orjson.dumps(final) + b"\n"
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                break
            self._record.last_write = time.time()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self._on_end()


def _collect(item: list[int] | Ending, pending: list[int]) -> _Next:
    """Add a token burst to ``pending`` (→ _MORE), or pass a final item through."""
    if isinstance(item, list):
        pending.extend(item)
        return _MORE
    return item


def _json(status: int, body: dict[str, Any], on_end: Callable[[], None] | None = None) -> Response:
    task = BackgroundTask(on_end) if on_end is not None else None
    return JSONResponse(body, status_code=status, background=task)


async def _body(request: Request) -> dict[str, Any]:
    data = orjson.loads(await request.body() or b"{}")
    if not isinstance(data, dict):
        raise ValueError("body must be a JSON object")
    return data


def _validation_detail(exc: Exception) -> list[dict[str, Any]]:
    if isinstance(exc, ValidationError):
        return [
            {"type": e["type"], "loc": ["body", *e["loc"]], "msg": e["msg"]} for e in exc.errors()
        ]
    return [{"type": "json_invalid", "loc": ["body"], "msg": str(exc)}]


def result_body(session: DecodeSession, top_logprobs: int | None) -> dict[str, Any]:
    """The non-stream 200 body of a finished decode."""
    body: dict[str, Any] = {
        "rid": session.rid,
        "token_ids": list(session.token_ids),
        "seq_len": session.seq_len,
        "timing_ms": session.timing_ms(),
    }
    if top_logprobs is not None:
        body["logprobs"] = _logprobs(list(session.token_ids), top_logprobs)
    return body


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

    async def decode(request: Request) -> Response | NdjsonStream:
        try:
            body = DecodeRequest.model_validate(await _body(request))
        except (ValueError, ValidationError) as exc:
            return _json(422, {"detail": _validation_detail(exc)})  # as FastAPI answers
        record = node.records.decode_begin(body.rid, body.stream, body.model_dump())
        session = node.begin(body, record)
        if isinstance(session, Rejection):
            return _json(session.status, session.body, ender(None, record, session.status))
        rejection = await node.start(session, body, record)
        if rejection is not None:
            # As the real node: its lock is free before the error answer leaves.
            ender(session, record, rejection.status)()
            return _json(rejection.status, rejection.body)
        top = body.top_logprobs if node.v16 else None
        if body.stream:
            interval = node.config.stream_interval_ms / 1000
            end = ender(session, record, 200)
            return NdjsonStream(session, record, end, node.v16, interval, top)
        await session.finished()
        ender(session, record, 200)()  # the real node frees its lock before it answers
        if session.finish_reason == "died":
            raise NodeDiedError("simulated node death")
        if session.finish_reason == "error":
            return _json(500, {"error": "decode stalled", "rid": body.rid})
        return _json(200, result_body(session, top))

    async def cancel(request: Request) -> Response:
        rid = str((await _body(request)).get("rid", ""))
        if node.cancel(rid):
            return _json(200, {"cancelled": rid})
        current = node.current.rid if node.current else None
        return _json(404, {"error": "no matching in-flight request", "current_rid": current})

    async def health(request: Request) -> Response:
        return _json(200, {"status": "ok"})

    async def capabilities(request: Request) -> Response:
        if not node.v16 or node.faults.take("poses_as_015", bool):
            return _json(404, {"detail": "Not Found"})
        return _json(200, node.capabilities_body())

    async def set_capabilities(request: Request) -> Response:
        values = await _body(request)
        names = ", ".join(CAPABILITIES)
        if set(values) - set(CAPABILITIES) or not all(isinstance(v, bool) for v in values.values()):
            return _json(400, {"error": f"capabilities are booleans named {names}"})
        node.capabilities |= values
        return _json(200, node.capabilities_body())

    async def decode_status(request: Request) -> Response:
        return _json(200, node.status())

    async def records(request: Request) -> Response:
        return _json(200, {**node.records.to_json(), "slot": node.slot.snapshot()})

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

    async def release(request: Request) -> Response:
        return _json(200, {"released": node.release_held()})

    async def held(request: Request) -> Response:
        return _json(200, {"held": node.held()})

    async def reset(request: Request) -> Response:
        node.reset()
        return _json(200, {"reset": True})

    return Starlette(
        routes=[
            Route("/pd/decode", decode, methods=["POST"]),
            Route("/pd/cancel", cancel, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/capabilities", capabilities, methods=["GET"]),
            Route("/decode_status", decode_status, methods=["GET"]),
            Route("/sim/records", records, methods=["GET"]),
            Route("/sim/capabilities", set_capabilities, methods=["POST"]),
            Route("/sim/faults", faults, methods=["GET", "POST", "DELETE"]),
            Route("/sim/release", release, methods=["POST"]),
            Route("/sim/held", held, methods=["GET"]),
            Route("/sim/reset", reset, methods=["POST"]),
        ]
    )
