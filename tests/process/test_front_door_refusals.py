"""Each connection the front door refuses or closes is counted by its reason in
`pd_gateway_connections_refused_total`, on a real uvicorn server and real sockets."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from router.process.front_door import OVERFLOW_RESERVE, FrontDoorLimits, protocol_class
from router.telemetry.metrics import Metrics
from tests.process.support import serving, wait_until

LIMITS = FrontDoorLimits(
    first_request_timeout_s=0.3, head_timeout_s=0.3, body_timeout_s=0.3, max_connections=2
)


async def app(scope: Any, receive: Any, send: Any) -> None:
    """Reads the whole body, then answers 200."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def answer_to(port: int, sent: bytes) -> bytes:
    """What the server answers to `sent` on a new connection, until it closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(sent)
    try:
        return await asyncio.wait_for(reader.read(), 5)
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


def refused(metrics: Metrics) -> dict[str, float]:
    return {
        sample.labels["reason"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "pd_gateway_connections_refused"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


@pytest.mark.parametrize(
    ("sent", "status", "reason"),
    [
        (b"", b"", "first_request_timeout"),
        (b"GET / HTTP/1.1\r\nhost: gw\r\n", b"HTTP/1.1 408 ", "head_timeout"),
        (
            b"POST / HTTP/1.1\r\nhost: gw\r\ncontent-length: 10\r\n\r\n{",
            b"HTTP/1.1 408 ",
            "body_timeout",
        ),
        (b"GET / HTTP/1.1\r\nx-long: " + b"a" * 100_000, b"HTTP/1.1 431 ", "headers_too_large"),
    ],
)
async def test_a_slow_or_oversized_request_is_counted_by_its_reason(
    sent: bytes, status: bytes, reason: str
) -> None:
    metrics = Metrics()
    async with serving(app, protocol_class(LIMITS, metrics.connection_refused)) as port:
        assert refused(metrics) == {}
        answer = await answer_to(port, sent)
        assert answer.startswith(status) if status else answer == b""
        # A request in time is not counted.
        in_time = await answer_to(port, b"GET / HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n")
        assert in_time.startswith(b"HTTP/1.1 200 ")
    assert refused(metrics) == {reason: 1.0}


async def test_connections_over_the_bound_are_counted_answered_or_not() -> None:
    metrics = Metrics()
    # The held connections send nothing: they must outlast the whole test (on a loaded
    # machine, more than LIMITS' 0.3 s) for the bound to stay reached.
    holding = replace(LIMITS, first_request_timeout_s=60)
    async with serving(app, protocol_class(holding, metrics.connection_refused)) as port:
        held = [
            await asyncio.open_connection("127.0.0.1", port) for _ in range(LIMITS.max_connections)
        ]
        answer = await answer_to(port, b"GET /models HTTP/1.1\r\nhost: gw\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 503 ")
        # The operator's probe is answered, and not counted.
        answer = await answer_to(port, b"GET /health HTTP/1.1\r\nhost: gw\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 ")
        held += [await asyncio.open_connection("127.0.0.1", port) for _ in range(OVERFLOW_RESERVE)]
        assert await answer_to(port, b"GET /health HTTP/1.1\r\nhost: gw\r\n\r\n") == b""
        for _, writer in held:
            writer.close()
    assert refused(metrics) == {"max_connections": 1.0, "overflow_reserve": 1.0}


def open_connections(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value("pd_gateway_client_connections")


async def test_open_connections_are_counted_up_and_down_refused_ones_too() -> None:
    metrics = Metrics()
    holding = replace(LIMITS, first_request_timeout_s=60)
    protocol = protocol_class(holding, metrics.connection_refused, metrics.client_connections)
    async with serving(app, protocol) as port:
        assert open_connections(metrics) == 0
        held = [
            await asyncio.open_connection("127.0.0.1", port) for _ in range(LIMITS.max_connections)
        ]
        await wait_until(
            lambda: open_connections(metrics) == LIMITS.max_connections,
            deadline_s=10,
            what="the held connections counted",
        )
        # Over the bound: answered 503 and closed, counted while open.
        answer = await answer_to(port, b"GET /models HTTP/1.1\r\nhost: gw\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 503 ")
        for _, writer in held:
            writer.close()
        await wait_until(
            lambda: open_connections(metrics) == 0, deadline_s=10, what="every connection closed"
        )
    assert refused(metrics) == {"max_connections": 1.0}
