"""The exact prefix index: a gateway following two vLLM servers' KV-cache events knows
what each holds, including prompts it never sent them, and forgets what they drop."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from sim.stack import ServerInfo, SimStack
from tests.support.deployment import latency_model
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.stacks import StackPool

MODEL = "sim-model"
ADMIN = {"authorization": "Bearer operator-secret"}
SET = "latency:prefill:default"
BLOCK = 16
EVENTS = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:*"}


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    args = [
        "--enable-prefix-caching",
        "--block-size",
        str(BLOCK),
        "--kv-events-config",
        json.dumps({**EVENTS, "topic": "kv"}),
    ]
    return sim_stacks.get(nodes=1, prefills=2, model=[MODEL], prefill_args=args)


@pytest.fixture(scope="module")
def gateway(stack: SimStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    endpoints = {p.url: p.kv_events_endpoint for p in stack.prefills}
    selection = {
        "prefix_index": "kv_events",
        "block_size": BLOCK,
        "kv_events": {"topic": "kv", "endpoints": endpoints},
    }
    with start_gateway(
        tmp_path_factory,
        [latency_model(stack, MODEL, selection=selection)],
        server={"expose_upstream": True},
        admin={"api_key": "operator-secret"},
    ) as running:
        yield running


async def complete_on(server: ServerInfo, prompt: list[int]) -> None:
    """A prompt sent to the server directly: the gateway learns of it only by its events."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(f"{server.url}/v1/completions", json=body)
        assert reply.status_code == 200, reply.text


async def index_of(http: httpx.AsyncClient, server: ServerInfo) -> dict[str, Any]:
    reply = await http.get("/admin/upstreams", headers=ADMIN)
    assert reply.status_code == 200, reply.text
    index: dict[str, Any] = reply.json()["models"][MODEL][SET][server.url]["kv_events"]
    return index


async def index_until(
    http: httpx.AsyncClient, server: ServerInfo, done: Any, what: str
) -> dict[str, Any]:
    """The server's index once `done(index)` (polled: events arrive on their own time)."""
    deadline = time.monotonic() + 15
    while not done(index := await index_of(http, server)):
        assert time.monotonic() < deadline, f"{what}: {index}"
        await asyncio.sleep(0.05)
    return index


@pytest.fixture
async def http(gateway: GatewayProcess, stack: SimStack) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the gateway, once both servers' events flow (a subscription takes effect
    some time after connecting: each server caches prompts until one event arrives)."""
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        for server in stack.prefills:
            probe = 50_000
            while (await index_of(client, server))["state"] != "live":
                probe += 1
                await complete_on(server, [probe] * BLOCK)
        yield client


async def through_gateway(http: httpx.AsyncClient, prompt: list[int]) -> tuple[str, str]:
    """(server, reason) of a completion sent through the gateway."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
    reply = await http.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    url, reason = reply.headers["x-pd-upstream"].split("; reason=")
    return url, reason


async def test_a_prompt_cached_on_a_server_is_sent_there(
    http: httpx.AsyncClient, stack: SimStack
) -> None:
    holder = stack.prefills[1]
    prompt = list(range(1000, 1000 + 4 * BLOCK))
    before = (await index_of(http, holder))["blocks"]
    await complete_on(holder, prompt)
    await index_until(http, holder, lambda i: i["blocks"] >= before + 4, "the blocks stored")
    # The gateway never sent this prompt anywhere: only the events tell where it is.
    url, reason = await through_gateway(http, [*prompt, 7, 7, 7])
    assert (url, reason) == (holder.url, "prefix:4 blocks")


async def test_a_cleared_server_is_forgotten(http: httpx.AsyncClient, stack: SimStack) -> None:
    holder = stack.prefills[0]
    prompt = list(range(3000, 3000 + 4 * BLOCK))
    await complete_on(holder, prompt)
    await index_until(http, holder, lambda i: i["blocks"] >= 4, "the blocks stored")
    async with httpx.AsyncClient(timeout=30) as sim:
        assert (await sim.post(f"{holder.url}/sim/reset")).status_code == 200
    index = await index_until(http, holder, lambda i: i["blocks"] == 0, "the cache cleared")
    assert index["state"] == "live"
    _, reason = await through_gateway(http, [*prompt, 7, 7, 7])
    assert not reason.startswith("prefix")
