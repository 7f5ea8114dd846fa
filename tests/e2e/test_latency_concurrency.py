"""The gate under load, end to end: no TileRT node is ever double-booked, waiting requests
are served by priority then arrival, and a full queue or a spent wait budget answers 429
with Retry-After. Priorities come from classification rules on an `x-tier` header.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import httpx
import openai
import pytest

from sim.stack import SimStack
from tests.support.deployment import (
    PRIORITY,
    directive,
    latency_model,
    sim_get,
    sim_post,
    tier_rules,
    version_args,
)
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.http import plain
from tests.support.stacks import StackPool
from tests.support.waiting import wait_until

pytestmark = pytest.mark.usefixtures("fresh_sims")

RULES = tier_rules(
    {
        "name": "impatient",
        "path": "latency",
        "max_queue_wait_ms": 300,
        "match": {"headers": {"x-tier": "impatient"}},
    },
)


@pytest.fixture(scope="module")
def stack(tilert_version: str, sim_stacks: StackPool) -> SimStack:
    version = version_args(tilert_version)
    return sim_stacks.get(
        nodes=5,
        prefills=1,
        model="ds",
        node_args=["--step-ms", "3", "--tokens-per-step", "2", *version["node_args"]],
        prefill_args=["--itl-ms", "0", "--prefill-ms-per-token", "0", *version["prefill_args"]],
    )


def pool_gateway(
    stack: SimStack, nodes: list, tmp: pytest.TempPathFactory, tilert: str, **gate: Any
) -> AbstractContextManager[GatewayProcess]:
    return start_gateway(
        tmp,
        [latency_model(stack, "ds", nodes=nodes, tilert=tilert)],
        gate={"max_queue_wait_ms": 60_000, **gate},
        timeouts={"decode_stall_s": 15},  # the blockers below are held at their start
        classification={"rules": RULES},
    )


@pytest.fixture(scope="module")
def pool4(
    stack: SimStack, tilert_version: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    nodes = stack.nodes[:4]
    with pool_gateway(stack, nodes, tmp_path_factory, tilert_version, max_queue=64) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def pool1(
    stack: SimStack, tilert_version: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    nodes = stack.nodes[4:]
    with pool_gateway(stack, nodes, tmp_path_factory, tilert_version, max_queue=12) as gateway:
        yield gateway


def received_order(stack: SimStack) -> list[tuple[float, str]]:
    """(time, prompt) of every prefill, in the order the prefill server received them:
    a slot is taken just before the prefill is sent, so this is the order of service."""
    requests = sim_get(stack.prefills[0].url, "/sim/requests")["requests"]
    return sorted((r["received"], r["body"]["messages"][0]["content"]) for r in requests)


def waiting(gateway: GatewayProcess) -> int:
    return gateway.pool()["models"]["ds"]["waiting"]


def chat(gateway: GatewayProcess, tier: str, text: str, **extra) -> httpx.Response:
    return plain().post(
        gateway.base_url + "/chat/completions",
        json={"model": "ds", "messages": [{"role": "user", "content": text}], **extra},
        headers={"x-tier": tier},
        timeout=60,
    )


async def test_forty_clients_four_nodes_no_double_booking(
    stack: SimStack, pool4: GatewayProcess
) -> None:
    client = openai.AsyncOpenAI(base_url=pool4.base_url, api_key="unused", max_retries=0)
    tiers = [("high", "mid", "low")[i % 3] for i in range(40)]

    async def one(i: int, tier: str) -> tuple[str, str]:
        text = f"reply {i} — ünïcode 第{i}号 ✓"
        reply = await client.chat.completions.create(
            model="ds",
            messages=[{"role": "user", "content": directive(text)}],
            extra_headers={"x-tier": tier},
        )
        return text, reply.choices[0].message.content

    async with client:
        results = await asyncio.gather(*(one(i, t) for i, t in enumerate(tiers)))
    assert all(expected == got for expected, got in results)
    decodes = 0
    for node in stack.nodes[:4]:
        records = sim_get(node.url, "/sim/records")
        assert records["max_overlap"] == 1, f"node {node.url} served two requests at once"
        decodes += len(records["decodes"])
        starts_ends = sorted((d["start"], d["end"]) for d in records["decodes"])
        for (_, end), (start, _) in itertools.pairwise(starts_ends):
            assert end <= start, "a decode began before the previous one ended"
    assert decodes == 40
    pool4.wait_all_free()


def test_waiters_are_served_by_priority_then_arrival(
    stack: SimStack, pool1: GatewayProcess
) -> None:
    node = stack.nodes[4]
    sim_post(node.url, "/sim/faults", {"hold_start": True, "count": 1})
    replies: list[httpx.Response] = []

    def send(tier: str, text: str) -> threading.Thread:
        thread = threading.Thread(target=lambda: replies.append(chat(pool1, tier, text)))
        thread.start()
        return thread

    threads = [send("low", "blocker")]
    wait_until(lambda: sim_get(node.url, "/decode_status")["status"] == "busy")
    order = ["low", "high", "mid", "low", "high", "mid", "high", "low", "mid", "low"]
    for i, tier in enumerate(order):
        threads.append(send(tier, f"{tier}-{i}"))
        wait_until(lambda n=i + 1: waiting(pool1) == n)
    assert sim_post(node.url, "/sim/release", {})["released"] == 1  # all queued: go
    for thread in threads:
        thread.join()
    assert [r.status_code for r in replies] == [200] * (len(order) + 1)
    served = [prompt for _, prompt in received_order(stack)][1:]
    expected = sorted(
        (f"{tier}-{i}" for i, tier in enumerate(order)),
        key=lambda name: (-PRIORITY[name.split("-")[0]], int(name.split("-")[1])),
    )
    assert served == expected
    pool1.wait_all_free()


def test_full_queue_and_spent_budget_answer_429_with_retry_after(
    stack: SimStack, pool1: GatewayProcess
) -> None:
    node = stack.nodes[4]
    sim_post(node.url, "/sim/faults", {"hold_start": True, "count": 1})
    blocker = threading.Thread(target=chat, args=(pool1, "low", "blocker"))
    blocker.start()
    wait_until(lambda: sim_get(node.url, "/decode_status")["status"] == "busy")

    impatient = chat(pool1, "impatient", "no time")
    assert impatient.status_code == 429
    assert impatient.json()["error"]["code"] == "wait_timeout"
    assert int(impatient.headers["retry-after"]) >= 1
    assert impatient.headers["x-pd-rule"] == "impatient"

    queued = [threading.Thread(target=chat, args=(pool1, "low", f"q{i}")) for i in range(12)]
    for thread in queued:
        thread.start()
    wait_until(lambda: waiting(pool1) == 12)
    full = chat(pool1, "high", "one too many")
    assert full.status_code == 429
    body = full.json()["error"]
    assert body["code"] == "queue_full" and body["type"] == "rate_limit_error"
    assert "queue is full" in body["message"]
    assert int(full.headers["retry-after"]) >= 1
    assert sim_post(node.url, "/sim/release", {})["released"] == 1
    for thread in [blocker, *queued]:
        thread.join()
    pool1.wait_all_free()
    assert sim_get(node.url, "/sim/records")["max_overlap"] == 1
