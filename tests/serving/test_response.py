"""PathResponse as a bare ASGI app: headers, errors, cleanup, and a client that goes away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import orjson

from router.errors import Overloaded, UpstreamError
from router.serving import Answer, LastChunk, PathResponse, RoutedRequest, single_chunk
from router.serving.live import LiveResponses
from router.serving.response import HOLD_HEAD, SERVER_SEND
from router.telemetry.metrics import Metrics
from tests.throughput.support import routed

OpenFn = Callable[[RoutedRequest, AsyncExitStack], Awaitable[Answer]]


class FnPath:
    def __init__(self, open_fn: OpenFn) -> None:
        self.open = open_fn


def respond(open_fn: OpenFn, headers: dict[str, str]) -> PathResponse:
    request = routed({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    request.headers = headers
    return PathResponse(FnPath(open_fn), request)


SCOPE: dict[str, Any] = {"type": "http", "asgi": {"spec_version": "2.3"}}


class Client:
    """Collects what the response sends; `leave()` makes `receive` report a disconnect."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self._gone = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def leave(self) -> None:
        self._gone.set()

    @property
    def status(self) -> int:
        return self.sent[0]["status"]

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent[1:])


async def test_headers_given_or_set_later_override_the_upstreams() -> None:
    closed: list[str] = []

    async def open_upstream(request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        stack.callback(closed.append, "upstream")
        headers = [(b"content-type", b"application/json"), (b"x-pd-route", b"upstream")]
        return Answer(201, headers, single_chunk(b"{}"))

    response = respond(open_upstream, {"X-PD-Route": "throughput"})
    response._request.headers["x-request-id"] = "abc"  # a path may change them, as a spill does
    client = Client()
    await response(SCOPE, client.receive, client.send)
    assert client.status == 201
    assert client.headers == {
        b"content-type": b"application/json",
        b"x-pd-route": b"throughput",
        b"x-request-id": b"abc",
    }
    assert client.body == b"{}"
    assert client.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert closed == ["upstream"]


async def test_a_bodys_chunks_go_to_the_servers_send_and_its_start_and_end_through_the_app() -> (
    None
):
    async def chunks() -> AsyncGenerator[bytes, None]:
        for chunk in (b"data: 1\n\n", b"", b"data: 2\n\n"):
            yield chunk

    async def open_upstream(request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        return Answer(200, [(b"content-type", b"text/event-stream")], chunks())

    app, server = Client(), Client()
    scope = {**SCOPE, SERVER_SEND: server.send}
    await respond(open_upstream, {})(scope, app.receive, app.send)
    assert [m["type"] for m in app.sent] == ["http.response.start", "http.response.body"]
    assert app.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert [m["body"] for m in server.sent] == [b"data: 1\n\n", b"data: 2\n\n"]
    assert all(m["more_body"] for m in server.sent)


def streamed(*body: bytes) -> OpenFn:
    async def chunks() -> AsyncGenerator[bytes, None]:
        for chunk in body:
            yield chunk

    async def open_upstream(request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        return Answer(200, [(b"content-type", b"text/event-stream")], chunks())

    return open_upstream


async def test_a_last_chunk_goes_out_with_the_bodys_end() -> None:
    app, server = Client(), Client()
    scope = {**SCOPE, SERVER_SEND: server.send}
    body = streamed(b"data: 1\n\n", LastChunk(b"data: 2\n\ndata: [DONE]\n\n"))
    await respond(body, {})(scope, app.receive, app.send)
    assert [m["body"] for m in server.sent] == [b"data: 1\n\n"]
    assert app.sent[-1] == {
        "type": "http.response.body",
        "body": b"data: 2\n\ndata: [DONE]\n\n",
        "more_body": False,
    }


async def test_a_chunk_after_one_said_to_be_last_is_sent_after_it() -> None:
    app, server = Client(), Client()
    scope = {**SCOPE, SERVER_SEND: server.send}
    await respond(streamed(LastChunk(b"a"), b"b"), {})(scope, app.receive, app.send)
    assert [m["body"] for m in server.sent] == [b"a", b"b"]
    assert app.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


async def test_what_the_answer_holds_upstream_is_given_back_before_its_last_bytes() -> None:
    closed: list[str] = []
    closed_at_end: list[list[str]] = []

    async def open_upstream(request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        stack.callback(closed.append, "upstream")
        return Answer(200, [(b"content-type", b"application/json")], single_chunk(b"{}"))

    app = Client()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body"):
            closed_at_end.append(list(closed))
        await app.send(message)

    await respond(open_upstream, {})(SCOPE, app.receive, send)
    assert closed_at_end == [["upstream"]]
    assert closed == ["upstream"]  # and only once


async def test_the_head_is_held_for_the_body_where_the_server_offers_it() -> None:
    app, server = Client(), Client()
    held: list[int] = []
    scope = {**SCOPE, SERVER_SEND: server.send, HOLD_HEAD: lambda: held.append(len(app.sent))}
    await respond(streamed(b"data: 1\n\n"), {})(scope, app.receive, app.send)
    assert held == [0]  # asked for just before the head was sent
    assert app.sent[0]["type"] == "http.response.start"


async def test_gateway_error_is_rendered_with_its_own_headers() -> None:
    async def open_upstream(request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        raise Overloaded("busy", retry_after_s=3, code="queue_full")

    client = Client()
    await respond(open_upstream, {"x-pd-route": "throughput"})(SCOPE, client.receive, client.send)
    assert client.status == 429
    assert client.headers[b"retry-after"] == b"3"
    assert client.headers[b"x-pd-route"] == b"throughput"
    assert orjson.loads(client.body)["error"]["code"] == "queue_full"


async def test_disconnect_while_waiting_for_the_upstream_cancels_it_and_cleans_up() -> None:
    waiting, cancelled = asyncio.Event(), asyncio.Event()
    closed: list[str] = []

    async def open_upstream(request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        stack.callback(closed.append, "leg")
        waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise UpstreamError("unreachable")

    client = Client()
    served = asyncio.ensure_future(respond(open_upstream, {})(SCOPE, client.receive, client.send))
    await waiting.wait()
    client.leave()
    await asyncio.wait_for(served, timeout=5)
    assert cancelled.is_set()
    assert closed == ["leg"]
    assert client.status == 499, "counted as the client leaving; nobody reads it"


async def test_client_gone_on_send_is_not_an_application_error() -> None:
    closed: list[str] = []

    async def open_upstream(request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        stack.callback(closed.append, "leg")
        return Answer(200, [], single_chunk(b"x"))

    async def broken_send(message: dict[str, Any]) -> None:
        raise OSError("connection reset")

    client = Client()
    await respond(open_upstream, {})(SCOPE, client.receive, broken_send)
    assert closed == ["leg"], "the upstream is closed all the same"


async def test_a_cut_stream_ends_with_an_error_event_and_done() -> None:
    live = LiveResponses()
    sent_one = asyncio.Event()

    async def open_upstream(request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        async def chunks() -> AsyncGenerator[bytes, None]:
            yield b"data: {}\n\n"
            sent_one.set()
            await asyncio.Event().wait()  # a stream that would run on past the grace period
            yield b"never"

        return Answer(200, [(b"content-type", b"text/event-stream")], chunks())

    client = Client()
    request = routed({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    served = asyncio.ensure_future(
        PathResponse(FnPath(open_upstream), request, live)(SCOPE, client.receive, client.send)
    )
    await sent_one.wait()
    assert len(live) == 1
    live.cut_all()
    await asyncio.wait_for(served, timeout=5)
    events = client.body.split(b"\n\n")
    assert events[0] == b"data: {}"
    assert orjson.loads(events[1].removeprefix(b"data: "))["error"]["code"] == "shutting_down"
    assert events[2:] == [b"data: [DONE]", b""]
    assert client.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert len(live) == 0
    # Logged with its true ending, not as a complete 200 answer.
    assert (request.access.status, request.access.error_code) == (503, "shutting_down")


async def test_a_request_cut_before_its_answer_gets_a_503() -> None:
    live = LiveResponses()
    waiting = asyncio.Event()

    async def open_upstream(request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        waiting.set()
        await asyncio.Event().wait()  # queued for a slot
        raise AssertionError("unreachable")

    client = Client()
    request = routed({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    served = asyncio.ensure_future(
        PathResponse(FnPath(open_upstream), request, live)(SCOPE, client.receive, client.send)
    )
    await waiting.wait()
    live.cut_all()
    await asyncio.wait_for(served, timeout=5)
    assert client.status == 503
    assert orjson.loads(client.body)["error"]["code"] == "shutting_down"
    assert (request.access.status, request.access.error_code) == (503, "shutting_down")


async def test_an_answer_is_counted_in_flight_while_it_is_served() -> None:
    gauge = Metrics().in_flight("latency")
    streaming = asyncio.Event()
    finish = asyncio.Event()

    async def open_upstream(request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        async def chunks() -> AsyncGenerator[bytes, None]:
            yield b"data: {}\n\n"
            streaming.set()
            await finish.wait()

        return Answer(200, [(b"content-type", b"text/event-stream")], chunks())

    client = Client()
    request = routed({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    response = PathResponse(FnPath(open_upstream), request, None, gauge)
    served = asyncio.ensure_future(response(SCOPE, client.receive, client.send))
    await streaming.wait()
    assert gauge._value.get() == 1
    finish.set()
    await asyncio.wait_for(served, timeout=5)
    assert gauge._value.get() == 0


async def test_an_error_before_the_answer_is_recorded_with_its_code() -> None:
    async def open_upstream(request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        raise Overloaded("no slot", retry_after_s=1, code="queue_full")

    client = Client()
    request = routed({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    await PathResponse(FnPath(open_upstream), request)(SCOPE, client.receive, client.send)
    assert (request.access.status, request.access.error_code) == (client.status, "queue_full")
