"""A conversation's next turn goes to the prefill server that computed its previous turn:
the one whose KV cache holds its prefix."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sim.stack import SimStack
from tests.support.deployment import directive, latency_model
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.stacks import StackPool

MODEL = "sim-model"


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(nodes=1, prefills=2, model=[MODEL])


@pytest.fixture(scope="module")
def gateway(stack: SimStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with start_gateway(
        tmp_path_factory, [latency_model(stack, MODEL)], server={"expose_upstream": True}
    ) as running:
        yield running


def first_turn(topic: str) -> list[dict[str, Any]]:
    context = f"You are helping with {topic}. " + " ".join(f"{topic} fact {i}." for i in range(40))
    return [{"role": "system", "content": context}, {"role": "user", "content": directive("ok")}]


async def test_a_second_turn_goes_to_the_server_of_the_first(
    gateway: GatewayProcess, stack: SimStack
) -> None:
    topics = [f"topic-{i}" for i in range(6)]
    firsts: dict[str, str] = {}
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as http:
        for topic in topics:
            reply = await http.post(
                "/chat/completions", json={"model": MODEL, "messages": first_turn(topic)}
            )
            assert reply.status_code == 200, reply.text
            firsts[topic] = reply.headers["x-pd-upstream"].split("; ")[0]
        # Both servers served some first turns, so the second turns have a choice to make.
        assert set(firsts.values()) == {p.url for p in stack.prefills}
        for topic in topics:
            messages = [
                *first_turn(topic),
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": directive("next")},
            ]
            reply = await http.post(
                "/chat/completions", json={"model": MODEL, "messages": messages}
            )
            assert reply.status_code == 200, reply.text
            url, reason = reply.headers["x-pd-upstream"].split("; reason=")
            assert url == firsts[topic]
            assert reason.startswith("prefix:")
            assert int(reason.removeprefix("prefix:").removesuffix(" blocks")) > 5
