"""A pooled connection never carries one answer into another request: an upstream that
answers a request and then sends something nobody asked for on the same connection (a
second answer, or garbage), in the same write as its answer or later while the connection
is idle in the pool, or that closes the idle connection, never reaches the next request,
which gets its own answer on a new connection. On real sockets, for every use the gateway
makes of a connection (a prefill, a TileRT node's decode stream, `proxy` mode streamed and
not), against both transports."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import orjson
import pytest

from router.config import ProxyConfig, UpstreamsConfig
from router.node import Node
from router.throughput.factory import make_throughput_path
from router.upstream import Upstreams, vllm
from router.upstream import tilert as node_api
from router.upstream.timeouts import Timeouts
from router.upstream.transport import Transport
from tests.throughput.support import routed
from tests.upstream.raw_server import chunked, read_request, serving

SMUGGLED = 666  # the token, or answer number, of the answer nobody asked for


@dataclass(frozen=True)
class Role:
    """One use the gateway makes of an upstream connection: the server's answer to its nth
    request, and what the gateway makes of the answer it gets (`seen(n)` for the nth)."""

    name: str
    answer: Callable[[int], bytes]
    ask: Callable[[Upstreams, str], Awaitable[object]]
    seen: Callable[[int], object]


def whole(content_type: bytes, body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
    return head % (content_type, len(body)) + body


def streamed(content_type: bytes, body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ntransfer-encoding: chunked\r\n\r\n"
    return head % content_type + chunked(body) + b"0\r\n\r\n"


def prefill_answer(n: int) -> bytes:
    choice = {"logprobs": {"content": [{"token": f"token_id:{n}"}]}, "finish_reason": "length"}
    data = {"id": f"chatcmpl-{n}", "choices": [choice], "usage": {"prompt_tokens": 3}}
    return whole(b"application/json", orjson.dumps(data))


async def ask_prefill(upstreams: Upstreams, url: str) -> object:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    data = await vllm.prefill(upstreams, url, "/v1/chat/completions", body, request_id="r")
    return vllm.parse_prefilled(data, "chat").first_token_id


def decode_answer(n: int) -> bytes:
    lines = b'{"t": [%d]}\n{"done": true, "n": 1, "finish_reason": "length"}\n' % n
    return streamed(b"application/x-ndjson", lines)


async def ask_node(upstreams: Upstreams, url: str) -> object:
    node = Node(host="127.0.0.1", http_port=int(url.rsplit(":", 1)[1]))
    body = node_api.decode_body(rid="r", first_token_id=1, max_tokens=8, sampling=None, timeout_s=1)
    stream = await node_api.open_decode(upstreams, node, body, stall_s=5)
    lines = []
    try:
        while (line := await stream.next_line()) is not None:
            lines.append(line)
    finally:
        await stream.aclose()
    return lines


def decode_lines(n: int) -> object:
    return [node_api.TokenLine([n]), node_api.DoneLine(1, "length")]


def completion(n: int) -> bytes:
    return b'{"id": "cmpl-%d", "choices": [{"text": "answer %d"}]}' % (n, n)


def completion_events(n: int) -> bytes:
    return b'data: {"id": "cmpl-%d", "choices": [{"text": "event %d"}]}\n\ndata: [DONE]\n\n' % (
        n,
        n,
    )


def asking_the_proxy(stream: bool) -> Callable[[Upstreams, str], Awaitable[object]]:
    """A completion through `proxy` mode: the status and body the client is sent."""

    async def ask(upstreams: Upstreams, url: str) -> object:
        path = make_throughput_path(ProxyConfig(mode="proxy", urls=[url]), upstreams=upstreams)
        body = {"model": "m", "prompt": "x", "max_tokens": 5, "stream": stream}
        async with AsyncExitStack() as stack:
            answer = await path.open(routed(body, endpoint="completions"), stack)
            return answer.status, b"".join([chunk async for chunk in answer.chunks])

    return ask


ROLES = [
    Role("prefill", prefill_answer, ask_prefill, lambda n: n),
    Role("node", decode_answer, ask_node, decode_lines),
    Role(
        "proxy",
        lambda n: whole(b"application/json", completion(n)),
        asking_the_proxy(stream=False),
        lambda n: (200, completion(n)),
    ),
    Role(
        "proxy_stream",
        lambda n: streamed(b"text/event-stream", completion_events(n)),
        asking_the_proxy(stream=True),
        lambda n: (200, completion_events(n)),
    ),
]


@asynccontextmanager
async def hostile(
    role: Role, after: bytes | None, when: str
) -> AsyncIterator[tuple[str, list[int], Callable[[], Awaitable[None]]]]:
    """A server answering its nth request (over every connection) with `role.answer(n)`,
    from 1; after the first answer, on its connection, it sends `after`: in the same write
    (`when="with_its_answer"`), or once the test calls `misbehave` (`"while_idle"`); with
    `after=None` it closes that connection then. Yields its URL, the connections it
    accepted, and `misbehave`, which returns once the bytes (or the close) have left."""
    answered = 0
    go, done = asyncio.Event(), asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answered
        while True:
            try:
                await read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            answered += 1
            first = answered == 1
            answer = role.answer(answered)
            if first and when == "with_its_answer":
                assert after is not None
                answer += after
            writer.write(answer)
            await writer.drain()
            if first and when == "while_idle":
                await go.wait()
                if after is None:
                    writer.close()
                    await writer.wait_closed()
                    done.set()
                    return
                writer.write(after)
                await writer.drain()  # on loopback: in the client's socket buffer
                done.set()

    async def misbehave() -> None:
        if when == "while_idle":
            go.set()
            await done.wait()

    async with serving(handler) as (url, accepted):
        yield url, accepted, misbehave


def one_connection(transport: Transport) -> Upstreams:
    """At most one connection per upstream: one dropped must give its place back."""
    return Upstreams(UpstreamsConfig(max_connections=1), Timeouts(), transport=transport)


AFTER = {
    "an_answer": None,  # the role's own answer, numbered SMUGGLED
    "garbage": b"garbage, not HTTP\r\n\r\n",
}


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.name)
@pytest.mark.parametrize("when", ["with_its_answer", "while_idle"])
@pytest.mark.parametrize("after", list(AFTER))
async def test_bytes_nobody_asked_for_never_reach_the_next_request(
    transport: Transport, role: Role, when: str, after: str
) -> None:
    sent = AFTER[after] or role.answer(SMUGGLED)
    async with hostile(role, sent, when) as (url, accepted, misbehave):
        upstreams = one_connection(transport)
        try:
            assert await role.ask(upstreams, url) == role.seen(1)
            await misbehave()
            assert await role.ask(upstreams, url) == role.seen(2)
        finally:
            await upstreams.aclose()
    assert len(accepted) == 2  # the first connection was not used again


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.name)
async def test_an_idle_connection_its_server_closed_is_not_used_again(
    transport: Transport, role: Role
) -> None:
    async with hostile(role, None, "while_idle") as (url, accepted, misbehave):
        upstreams = one_connection(transport)
        try:
            assert await role.ask(upstreams, url) == role.seen(1)
            await misbehave()
            assert await role.ask(upstreams, url) == role.seen(2)
        finally:
            await upstreams.aclose()
    assert len(accepted) == 2
