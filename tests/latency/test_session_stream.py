"""A streamed latency answer always closes its session, even when the client left before
the body was ever iterated."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from router.latency.path import SessionStream


class FakeSession:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


async def body(started: list[bool]) -> AsyncIterator[bytes]:
    started.append(True)
    yield b"data: x\n\n"


async def test_closes_when_the_client_is_gone_before_the_body_starts() -> None:
    session = FakeSession()
    started: list[bool] = []
    response = SessionStream(session, body(started), media_type="text/event-stream")  # type: ignore[arg-type]

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        raise OSError("the client is gone")

    scope = {"type": "http", "asgi": {"spec_version": "2.4"}, "http_version": "1.1"}
    with contextlib.suppress(Exception):  # how the failed send surfaces varies by version
        await response(scope, receive, send)
    assert session.closed == 1


async def test_closes_after_a_complete_body() -> None:
    session = FakeSession()
    started: list[bool] = []
    response = SessionStream(session, body(started), media_type="text/event-stream")  # type: ignore[arg-type]
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)
    assert started == [True]
    assert session.closed == 1
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
