"""Two vLLM servers behind a running gateway, one of them busy with requests the gateway
never sent (its queue is known only from its `/metrics`): the gateway sends its own
requests to the other, and says the server's queue decided (`reason=queue`).

The busy server runs one request at a time (`--max-num-seqs 1`); three long streams sent
to it directly leave one running and two waiting.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from sim.stack import SimStack
from tests.support.deployment import directive, gateway_config
from tests.support.gateway import GatewayProcess, running_gateways
from tests.support.stacks import StackPool

MODEL = "sim-model"
ADMIN = {"authorization": "Bearer operator-secret"}
HELD = 3
SET = "proxy"


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=0,
        prefills=2,
        model=[MODEL],
        prefill_args=["--prefill-ms-per-token", "0", "--itl-ms", "5"],
        instance_args={"prefill-0": ["--max-num-seqs", "1"]},
    )


@pytest.fixture(scope="module")
def gateway(stack: SimStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    model = {
        "name": MODEL,
        "tokenizer": "deepseek",
        "throughput": {"mode": "proxy", "urls": [p.url for p in stack.prefills]},
    }
    config = gateway_config(
        [model],
        classification={"rules": {"default": {"name": "native", "path": "throughput"}}},
        server={"expose_upstream": True},
        admin={"api_key": "operator-secret"},
    )
    config["upstreams"] = {"load_interval_s": 0.2}
    with running_gateways(tmp_path_factory, {"gateway": config}) as running:
        yield running["gateway"]


async def hold(url: str, started: asyncio.Event) -> None:
    """A long stream on the server at `url` (2000 tokens at 5 ms), read until cancelled."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hold the server"}],
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
    }
    async with (
        httpx.AsyncClient(base_url=url, timeout=60) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as reply,
    ):
        started.set()
        async for _ in reply.aiter_bytes():
            pass


@pytest.fixture
async def busy(stack: SimStack) -> AsyncIterator[str]:
    """The first server, with one request running and the rest waiting."""
    url = stack.prefills[0].url
    started = [asyncio.Event() for _ in range(HELD)]
    holders = [asyncio.create_task(hold(url, event)) for event in started]
    try:
        yield url
    finally:
        for task in holders:
            task.cancel()
        await asyncio.wait(holders)


async def load_seen(http: httpx.AsyncClient, busy_url: str, idle_url: str) -> dict[str, Any]:
    """The proxy set's admin snapshot, once the gateway has read both servers' figures and
    the busy one's queue (polled: the figures arrive on the scraper's own schedule)."""
    deadline = time.monotonic() + 15
    while True:
        reply = await http.get("/admin/upstreams", headers=ADMIN)
        assert reply.status_code == 200, reply.text
        servers: dict[str, Any] = reply.json()["models"][MODEL][SET]
        busy_load = servers[busy_url].get("load", {})
        if busy_load.get("waiting") == HELD - 1 and "load" in servers[idle_url]:
            return servers
        assert time.monotonic() < deadline, servers
        await asyncio.sleep(0.05)


def ask(text: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": directive(text)}],
        "max_tokens": 20,
    }


async def test_the_picks_move_to_the_server_without_a_queue(
    gateway: GatewayProcess, stack: SimStack, busy: str
) -> None:
    idle = stack.prefills[1].url
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        servers = await load_seen(http, busy, idle)
        assert servers[busy]["load"]["running"] == 1
        assert servers[busy]["load"]["stale"] is False
        assert servers[idle]["load"]["running"] == servers[idle]["load"]["waiting"] == 0
        assert servers[busy]["outstanding"] == 0  # the gateway sent none of them
        picks = []
        for i in range(6):
            reply = await http.post(
                "/v1/chat/completions", json=ask(f"answer {i}"), headers={"x-workload": "batch"}
            )
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["message"]["content"] == f"answer {i}"
            picks.append(reply.headers["x-pd-upstream"])
        metrics = (await http.get("/metrics")).text
    assert picks == [f"{idle}; reason=queue"] * 6
    waiting = [
        line
        for line in metrics.splitlines()
        if line.startswith("pd_gateway_upstream_requests_waiting{") and busy in line
    ]
    assert waiting and waiting[0].endswith(f" {float(HELD - 1)}")


async def test_once_the_queue_is_gone_both_servers_are_chosen_again(
    gateway: GatewayProcess, stack: SimStack
) -> None:
    urls = {p.url for p in stack.prefills}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        deadline = time.monotonic() + 15
        while True:  # the holders of the other test have gone: wait for fresh, empty queues
            reply = await http.get("/admin/upstreams", headers=ADMIN)
            servers = reply.json()["models"][MODEL][SET]
            loads = [servers[url].get("load", {}) for url in urls]
            if all(load.get("running") == 0 and load.get("waiting") == 0 for load in loads):
                break
            assert time.monotonic() < deadline, servers
            await asyncio.sleep(0.05)
        picks = []
        for i in range(4):
            reply = await http.post("/v1/chat/completions", json=ask(f"{i}"))
            assert reply.status_code == 200, reply.text
            picks.append(reply.headers["x-pd-upstream"])
    assert {pick.split("; ")[0] for pick in picks} == urls
    # Taken in turn, or away from the server a scrape caught serving the previous request.
    assert {pick.split("; reason=")[1] for pick in picks} <= {"rotation", "queue"}
