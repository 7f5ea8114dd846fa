"""Clients that never finish their request, against the real gateway process: each is
answered 408 or closed within its deadline, while a live stream beside them runs to its
end and `/health` answers; beyond `server.max_connections`, new connections get a 503
(the operator's `/health` still answered) or are closed at once; and a body declared over
`server.max_body_bytes` is refused before it is read."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import orjson
import pytest

from sim.stack import SimStack
from tests.support.deployment import directive, gateway_config, latency_model
from tests.support.gateway import GatewayProcess, running_gateways
from tests.support.http import plain
from tests.support.stacks import StackPool

MODEL = "ds"
FIRST_REQUEST_S = 3.0  # the longest: a loaded test's clients may be slow to begin
HEAD_S = 1.5
BODY_S = 1.5
SLOW_CLIENTS = 1000  # a third silent, a third with a slow head, a third with a slow body
STREAM_WORDS = 400  # some 5 s at the node's 20 ms a step
NODE_BEGUN_EVENTS = 5  # the role, the prefill's token, then the node's
SLACK_S = 3.0  # a loaded machine's lateness, on top of a deadline
MAX_CONNECTIONS = 40
OVERFLOW_RESERVE = 64  # router.process.front_door.OVERFLOW_RESERVE
MAX_BODY_BYTES = 1024 * 1024
LENIENT = {"kv_transfer_s": 30, "kv_admission_s": 30, "decode_stall_s": 30}
HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
    b"content-length: 1000\r\n\r\n"
)


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(nodes=2, prefills=1, model=MODEL, node_args=["--step-ms", "20"])


@pytest.fixture(scope="module")
def gateways(
    stack: SimStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, GatewayProcess]]:
    # A node for each gateway: two gateways, each with a gate of its own, would both take
    # (and probe, and flush) a node they shared.
    first, second = stack.nodes
    deadlines = {
        "first_request_timeout_s": FIRST_REQUEST_S,
        "head_timeout_s": HEAD_S,
        "body_timeout_s": BODY_S,
        "max_body_bytes": MAX_BODY_BYTES,
    }
    bounded = {"max_connections": MAX_CONNECTIONS, "first_request_timeout_s": 60}
    configs = {
        # Generous backend timeouts: the flood loads the machine the simulators run on.
        "deadlines": gateway_config(
            [latency_model(stack, MODEL, nodes=[first])], server=deadlines, timeouts=LENIENT
        ),
        "bounded": gateway_config([latency_model(stack, MODEL, nodes=[second])], server=bounded),
    }
    with running_gateways(tmp_path_factory, configs) as running:
        yield running


@dataclass
class Ending:
    kind: str
    waited_s: float  # from when its deadline started to when the connection ended
    answer: bytes


def address(gateway: GatewayProcess) -> tuple[str, int]:
    parts = urlsplit(gateway.url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


async def slow_client(host: str, port: int, kind: str) -> Ending:
    """A client that starts a request (or not) and stalls; how its connection ended."""
    # Each clock is read before what starts the deadline: the gateway's starts later.
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(host, port)
    # A few bytes early on, then nothing: the gateway's deadline, not a write racing
    # it, ends the connection (a write after it would make the answer a reset).
    if kind == "slow head":
        started = time.monotonic()
        await drip(writer, HEAD[:3], 0.1)
    elif kind == "slow body":
        started = time.monotonic()
        writer.write(HEAD)
        await drip(writer, b'{"m', 0.1)
    try:
        answer = await asyncio.wait_for(reader.read(), 30)
    except ConnectionError as exc:
        answer = repr(exc).encode()
    ended = time.monotonic()
    await close(writer)
    return Ending(kind, ended - started, answer)


async def drip(writer: asyncio.StreamWriter, data: bytes, every_s: float) -> None:
    """`data` a byte at a time; the rest dropped if the gateway closed meanwhile."""
    for byte in data:
        if writer.is_closing():
            return
        with contextlib.suppress(ConnectionError):
            writer.write(bytes([byte]))
        await asyncio.sleep(every_s)


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


def stream_in_background(
    gateway: GatewayProcess,
) -> tuple[threading.Thread, list[str], list[float]]:
    """A long streamed answer (some 5 s), begun at the node (its decode open, not only
    the prefill's first token relayed): its lines and when it ended."""
    begun = threading.Event()
    lines: list[str] = []
    ended: list[float] = []
    text = " ".join(f"word{i}" for i in range(STREAM_WORDS))
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": directive(text)}],
        "stream": True,
    }

    def run() -> None:
        with plain().stream(
            "POST", gateway.base_url + "/chat/completions", json=body, timeout=60
        ) as answer:
            for line in answer.iter_lines():
                lines.append(line)
                if len(lines) > 2 * NODE_BEGUN_EVENTS:  # an event and its blank line each
                    begun.set()
        ended.append(time.monotonic())
        begun.set()

    thread = threading.Thread(target=run)
    thread.start()
    assert begun.wait(60), "the stream did not begin"
    return thread, lines, ended


@pytest.mark.serial  # asserts when each client was dropped, to within SLACK_S
def test_slow_clients_are_dropped_on_time_while_streams_and_health_carry_on(
    gateways: dict[str, GatewayProcess],
) -> None:
    gateway = gateways["deadlines"]
    host, port = address(gateway)
    gateway.wait_all_free()  # its node probed and in service
    thread, lines, ended = stream_in_background(gateway)
    kinds = ["silent", "slow head", "slow body"]

    async def flood() -> tuple[list[Ending], list[int]]:
        clients = [
            asyncio.create_task(slow_client(host, port, kinds[i % 3])) for i in range(SLOW_CLIENTS)
        ]
        await asyncio.sleep(0.5)
        # The operator's probe, while every slow client holds its connection.
        health = [
            (await asyncio.to_thread(plain().get, gateway.url + "/health", timeout=5)).status_code
            for _ in range(3)
        ]
        return await asyncio.gather(*clients), health

    flood_started = time.monotonic()
    endings, health = asyncio.run(flood())
    flood_over = time.monotonic()
    thread.join(30)

    assert health == [200, 200, 200]
    deadline = {"silent": FIRST_REQUEST_S, "slow head": HEAD_S, "slow body": BODY_S}
    for ending in endings:
        limit = deadline[ending.kind]
        assert limit - 0.1 <= ending.waited_s <= limit + SLACK_S, ending
        if ending.kind == "silent":
            assert ending.answer == b"", ending
        else:
            status, _, body = ending.answer.partition(b"\r\n\r\n")
            assert status.startswith(b"HTTP/1.1 408 "), ending
            assert orjson.loads(body)["error"]["code"] == "request_timeout"
    events = [line for line in lines if line]
    assert events[-1] == "data: [DONE]" and f"word{STREAM_WORDS - 1}" in "".join(events)
    assert ended[0] > flood_started + max(deadline.values()), "the stream outlived the deadlines"
    assert flood_over - flood_started < max(deadline.values()) + SLACK_S + 1


def test_a_body_declared_over_the_limit_is_refused_unread(
    gateways: dict[str, GatewayProcess],
) -> None:
    host, port = address(gateways["deadlines"])

    async def declare() -> bytes:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(HEAD.replace(b"1000", str(MAX_BODY_BYTES + 1).encode()) + b"{")
        answer = await asyncio.wait_for(reader.read(), 5)  # not waiting for a body
        await close(writer)
        return answer

    head, _, body = asyncio.run(declare()).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ")
    assert b"connection: close" in head.lower()
    error = orjson.loads(body)["error"]
    assert error["code"] == "request_too_large"
    assert f"at most {MAX_BODY_BYTES} bytes" in error["message"]


def test_beyond_the_connection_bound_only_the_operator_is_answered(
    gateways: dict[str, GatewayProcess],
) -> None:
    gateway = gateways["bounded"]
    host, port = address(gateway)

    async def over_the_bound() -> None:
        held = [await asyncio.open_connection(host, port) for _ in range(MAX_CONNECTIONS)]
        refused = await asyncio.to_thread(plain().get, gateway.base_url + "/models", timeout=5)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "too_many_connections"
        assert refused.headers["connection"] == "close"
        health = await asyncio.to_thread(plain().get, gateway.url + "/health", timeout=5)
        assert health.status_code == 200
        held += [await asyncio.open_connection(host, port) for _ in range(OVERFLOW_RESERVE)]
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /health HTTP/1.1\r\nhost: gw\r\n\r\n")
        try:
            assert await asyncio.wait_for(reader.read(), 5) == b"", "closed, unanswered"
        except ConnectionResetError:
            pass
        for _, held_writer in [*held, (reader, writer)]:
            await close(held_writer)

    asyncio.run(over_the_bound())
    deadline = time.monotonic() + 10
    while (answer := plain().get(gateway.base_url + "/models", timeout=5)).status_code != 200:
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.05)


def test_a_head_over_the_limit_is_refused_before_it_ends(
    gateways: dict[str, GatewayProcess],
) -> None:
    host, port = address(gateways["deadlines"])

    async def long_head() -> bytes:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /health HTTP/1.1\r\nhost: gw\r\nx-long: " + b"a" * 100_000)
        answer = await asyncio.wait_for(reader.read(), 5)  # the head never ends
        await close(writer)
        return answer

    head, _, body = asyncio.run(long_head()).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 ")
    assert orjson.loads(body)["error"]["code"] == "headers_too_large"
