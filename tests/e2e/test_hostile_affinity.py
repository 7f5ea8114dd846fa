"""Hostile prompts against a gateway that encodes every prompt for prefix affinity (the
default) in front of three prefill servers: each is refused by the existing request limits
or served, never a 5xx, and a small request sent while one is being handled is answered
before it.

The gateway runs with its default limits (`server.max_body_bytes`: 32 MiB, so a 10 MB
message is read whole and must be judged after parsing).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest

from sim.stack import SimStack
from tests.support.deployment import directive, latency_model
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.stacks import StackPool

MODEL = "sim-model"


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(nodes=2, prefills=3, model=[MODEL])


@pytest.fixture(scope="module")
def gateway(stack: SimStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with start_gateway(
        tmp_path_factory, [latency_model(stack, MODEL)], server={"expose_upstream": True}
    ) as running:
        yield running


def chat(messages: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, "max_tokens": 4, **more}


def nested_content(depth: int) -> list[Any]:
    """A content part whose text sits `depth` lists deep."""
    content: Any = {"type": "text", "text": "deep"}
    for _ in range(depth):
        content = [content]
    return [content]


TEN_MB = "lorem ipsum " * (10 * 1024 * 1024 // 12)
HOSTILE = {
    # name: (body, status, code; None: any code)
    "a message of 10 MB": (
        # Read whole (under 32 MiB), then counted: too long for the latency path, and the
        # model has no other.
        chat([{"role": "user", "content": TEN_MB}]),
        400,
        "no_throughput_path",
    ),
    "10,000 messages": (
        chat([{"role": "user", "content": "hi"}] * 10_000),
        400,
        "limit_exceeded",
    ),
    "as many messages as allowed": (
        chat([{"role": "user", "content": f"turn {i}"} for i in range(4096)]),
        200,
        None,
    ),
    "content nested past the depth limit": (
        chat([{"role": "user", "content": nested_content(80)}]),
        400,
        "limit_exceeded",
    ),
    "content nested within the depth limit": (
        chat([{"role": "user", "content": nested_content(40)}]),
        400,
        None,
    ),
}
COPIES = {"a message of 10 MB": 3}
"""Cases sent several times at once: together they take the gateway long enough (counting
tens of MB of text) for a small request sent after them to be answered first."""


async def chunks(body: bytes, sent: asyncio.Event) -> AsyncIterator[bytes]:
    """The body in pieces; `sent` is set once the last has been handed to the connection."""
    step = 1024 * 1024
    for start in range(0, len(body), step):
        yield body[start : start + step]
    sent.set()


@pytest.fixture
async def http(gateway: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=120) as client:
        yield client


async def small(http: httpx.AsyncClient) -> httpx.Response:
    return await http.post(
        "/chat/completions", json=chat([{"role": "user", "content": directive("still here")}])
    )


@pytest.mark.parametrize("name", list(HOSTILE))
async def test_a_hostile_prompt_is_refused_or_served_and_the_gateway_stays_responsive(
    http: httpx.AsyncClient, name: str
) -> None:
    body, status, code = HOSTILE[name]
    copies = COPIES.get(name, 1)
    sent = [asyncio.Event() for _ in range(copies)]
    content = orjson.dumps(body)
    hostile = [
        asyncio.create_task(
            http.post(
                "/chat/completions",
                content=chunks(content, event),
                headers={"content-type": "application/json"},
            )
        )
        for event in sent
    ]
    for event in sent:
        await event.wait()  # the whole hostile body is on its way
    meanwhile = await small(http)
    answered_first = not any(task.done() for task in hostile)
    for reply in await asyncio.gather(*hostile):
        assert reply.status_code == status, reply.text[:500]
        if status == 400:
            error = reply.json()["error"]
            assert error["type"] == "invalid_request_error" and error["message"]
            assert code is None or error["code"] == code, error
            assert len(reply.content) < 4096, "an error does not echo the input back"
    assert meanwhile.status_code == 200, meanwhile.text
    assert meanwhile.json()["choices"][0]["message"]["content"] == "still here"
    if copies > 1:
        assert answered_first, "the small request waited for the hostile ones"
