"""A response's head held back by `HOLD_HEAD` leaves in one write with the first bytes of
its body, or on the loop's next turn if nothing follows at once; the answer's bytes are the
same either way, on a real uvicorn server and real sockets."""

from __future__ import annotations

import asyncio
from typing import Any

from router.process.front_door import FrontDoorLimits, HeadHold, protocol_class
from router.serving.response import HOLD_HEAD
from tests.process.support import serving

LIMITS = FrontDoorLimits(
    first_request_timeout_s=5, head_timeout_s=5, body_timeout_s=5, max_connections=8
)


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"extra {name}"


def holding() -> tuple[HeadHold, Transport]:
    transport = Transport()
    return HeadHold(transport, asyncio.get_running_loop()), transport  # type: ignore[arg-type]


async def next_turn() -> None:
    """Until the callbacks scheduled so far have run."""
    turned = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(turned.set_result, None)
    await turned


async def test_a_held_head_leaves_with_the_next_write() -> None:
    writes, transport = holding()
    writes.hold_next()
    writes.write(b"HEAD")
    assert transport.writes == []
    writes.write(b"BODY")
    writes.write(b"MORE")
    await next_turn()
    assert transport.writes == [b"HEADBODY", b"MORE"]


async def test_a_held_head_that_nothing_follows_leaves_on_the_next_turn() -> None:
    writes, transport = holding()
    writes.hold_next()
    writes.write(b"HEAD")
    await next_turn()
    assert transport.writes == [b"HEAD"]
    writes.write(b"BODY")
    assert transport.writes == [b"HEAD", b"BODY"]


async def test_closing_sends_a_held_head_first_and_the_rest_is_the_transports() -> None:
    writes, transport = holding()
    writes.hold_next()
    writes.write(b"HEAD")
    writes.close()
    assert transport.writes == [b"HEAD"] and transport.closed
    assert writes.get_extra_info("peername") == "extra peername"
    await next_turn()
    assert transport.writes == [b"HEAD"]


async def app(scope: Any, receive: Any, send: Any) -> None:
    """Holds its head; `/later` sends its body a loop turn after the head."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    scope[HOLD_HEAD]()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    if scope["path"] == "/later":
        await next_turn()
        await next_turn()
    await send({"type": "http.response.body", "body": b"abc", "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def test_held_heads_reach_the_client_whole_and_in_order() -> None:
    async with serving(app, protocol_class(LIMITS)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = "GET {} HTTP/1.1\r\nhost: x\r\n\r\n"
        writer.write(request.format("/now").encode() + request.format("/later").encode())
        answers = b""
        while answers.count(b"0\r\n\r\n") < 2:
            answers += await asyncio.wait_for(reader.read(65536), 5)
        writer.close()
    first, second, rest = answers.split(b"0\r\n\r\n")
    for answer in (first, second):
        head, body = answer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"transfer-encoding: chunked" in head
        assert body == b"3\r\nabc\r\n"
    assert rest == b""
