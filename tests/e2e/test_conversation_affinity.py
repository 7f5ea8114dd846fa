"""A conversation through a running gateway, turn after turn, in front of three prefill
servers each in its own process: it stays on the server that holds its prefix while that
server is healthy and not too busy, and moves when it is killed or overloaded. A session
(`x-session-id`) with prefix affinity off sticks to one server and moves when it is killed.

The servers' own load figures are not read (`upstreams.load_interval_s: 0`): the choices
rest on the gateway's own requests in flight and on what it sent where, which the test
controls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from sim.stack import SimStack
from tests.support.deployment import directive, gateway_config, node_entry, version_args
from tests.support.gateway import GatewayProcess, running_gateways
from tests.support.http import plain
from tests.support.killable import KillableServer, killable_servers
from tests.support.stacks import StackPool

MODEL = "sim-model"
ADMIN = {"authorization": "Bearer operator-secret"}
SET = "latency:prefill:default"
HOLDERS = 2


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    """The TileRT nodes: for the first gateway one per request the tests hold in flight at
    once and one more, and one for the second."""
    return sim_stacks.get(nodes=HOLDERS + 2, prefills=0, model=[MODEL], **version_args("0.1.6"))


@pytest.fixture(scope="module")
def prefills() -> Iterator[list[KillableServer]]:
    with killable_servers(3, model=MODEL, args=version_args("0.1.6")["prefill_args"]) as servers:
        yield servers


@pytest.fixture(scope="module")
def gateways(
    stack: SimStack, prefills: list[KillableServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, GatewayProcess]]:
    """`prefix`: prefix affinity on, its scorer at weight 1 (a cached prompt is worth one
    prompt's work ahead, so that the two requests the overload test holds outweigh the
    conversation's cache; at the default weight, 2, it would take twice the work);
    `session`: prefix affinity off."""
    configs = {}
    own_nodes = {"prefix": stack.nodes[: HOLDERS + 1], "session": stack.nodes[HOLDERS + 1 :]}
    selections = {"prefix": {"weights": {"prefix": 1}}, "session": {"prefix_affinity": False}}
    for name, selection in selections.items():
        model = {
            "name": MODEL,
            "tokenizer": "deepseek",
            "latency": {
                "tilert": "0.1.6",
                "prefill": [p.url for p in prefills],
                "nodes": [node_entry(n) for n in own_nodes[name]],
                "max_seq_len": 131072,
            },
            "selection": selection,
        }
        config = gateway_config(
            [model],
            server={"expose_upstream": True},
            admin={"api_key": "operator-secret"},
            gate={"max_queue_wait_ms": 5_000},
            timeouts={"prefill_s": 15},
        )
        config["upstreams"] = {"probe_interval_s": 0.1, "load_interval_s": 0}
        configs[name] = config
    with running_gateways(tmp_path_factory, configs) as running:
        for gateway in running.values():
            gateway.wait_all_free()
        yield running


async def servers_of(http: httpx.AsyncClient) -> dict[str, Any]:
    reply = await http.get("/admin/upstreams", headers=ADMIN)
    assert reply.status_code == 200, reply.text
    servers: dict[str, Any] = reply.json()["models"][MODEL][SET]
    return servers


async def until_state(http: httpx.AsyncClient, url: str, *states: str) -> dict[str, Any]:
    """The server's record once its state is one of `states` (polled, with a deadline)."""
    deadline = time.monotonic() + 20
    while (record := (await servers_of(http))[url])["state"] not in states:
        assert time.monotonic() < deadline, record
        await asyncio.sleep(0.05)
    return record


async def every_server_eligible(http: httpx.AsyncClient) -> None:
    """Each test starts with no server out (a server another test restarted is let back by
    the probes; until a request succeeds there it is on probation). A gateway whose probes
    caught that restart's downtime fewer times than it takes to eject a server keeps it in
    service as `failing` until a request succeeds there."""
    for url in await servers_of(http):
        await until_state(http, url, "healthy", "probation", "failing")


@pytest.fixture
async def prefix_http(gateways: dict[str, GatewayProcess]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateways["prefix"].url, timeout=30) as http:
        await every_server_eligible(http)
        yield http


@pytest.fixture
async def session_http(gateways: dict[str, GatewayProcess]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateways["session"].url, timeout=30) as http:
        await every_server_eligible(http)
        yield http


def system_prompt(topic: str) -> str:
    return f"You are helping with {topic}. " + " ".join(f"{topic} fact {i}." for i in range(200))


class Conversation:
    """One chat, its messages growing by a question and the answer each turn."""

    def __init__(self, http: httpx.AsyncClient, topic: str) -> None:
        self._http = http
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt(topic)}]
        self._turn = 0

    async def turn(self) -> tuple[str, str]:
        """Ask the next question; (server, reason) of the answer."""
        self._turn += 1
        messages = [*self.messages, {"role": "user", "content": f"And question {self._turn}?"}]
        reply = await self._http.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 8}
        )
        assert reply.status_code == 200, reply.text
        answer = reply.json()["choices"][0]["message"]["content"]
        assert answer
        self.messages = [*messages, {"role": "assistant", "content": answer}]
        url, reason = reply.headers["x-pd-upstream"].split("; reason=")
        return url, reason


def blocks(reason: str) -> int:
    assert reason.startswith("prefix:") and reason.endswith(" blocks"), reason
    return int(reason.removeprefix("prefix:").removesuffix(" blocks"))


def server_at(prefills: list[KillableServer], url: str) -> KillableServer:
    return next(p for p in prefills if p.url == url)


async def restarted(http: httpx.AsyncClient, server: KillableServer) -> None:
    """Once the probes have taken a killed server out, start it again on its port and wait
    until they let it back. Restarted before its failures were enough to eject it, it would
    stay `failing` until a request succeeded there, however many probes it answered."""
    await until_state(http, server.url, "ejected")
    await asyncio.to_thread(server.start)
    await until_state(http, server.url, "probation", "healthy")


async def test_a_conversation_stays_on_the_server_holding_its_prefix(
    prefix_http: httpx.AsyncClient,
) -> None:
    chat = Conversation(prefix_http, "geology")
    first, _ = await chat.turn()
    held = []
    for _ in range(5):
        url, reason = await chat.turn()
        assert url == first
        held.append(blocks(reason))
    # Each turn finds the whole previous turn there, a little more each time.
    assert held == sorted(held) and held[0] < held[-1]
    assert held[0] > 50  # the system prompt alone is over 50 blocks


async def test_a_conversation_moves_when_its_server_is_killed(
    prefix_http: httpx.AsyncClient, prefills: list[KillableServer]
) -> None:
    chat = Conversation(prefix_http, "astronomy")
    home, _ = await chat.turn()
    assert (await chat.turn())[0] == home
    server = server_at(prefills, home)
    await asyncio.to_thread(server.kill)
    try:
        await until_state(prefix_http, home, "ejected")
        moved, reason = await chat.turn()
        assert moved != home
        assert not reason.startswith("prefix"), "no other server held the conversation"
        # The new server now holds it: the next turns stay there.
        for _ in range(2):
            url, reason = await chat.turn()
            assert url == moved
            assert blocks(reason) > 50
    finally:
        await restarted(prefix_http, server)


async def hold(http: httpx.AsyncClient, topic: str, i: int) -> None:
    """A request of another conversation on the same system prompt, with a long question
    of its own (about two thirds of the system prompt's length)."""
    question = " ".join(f"question {i} detail {j}." for j in range(100))
    messages = [
        {"role": "system", "content": system_prompt(topic)},
        {"role": "user", "content": question},
    ]
    await http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})


async def test_a_conversation_moves_when_its_server_is_overloaded(
    prefix_http: httpx.AsyncClient,
    prefills: list[KillableServer],
    gateways: dict[str, GatewayProcess],
) -> None:
    chat = Conversation(prefix_http, "botany")
    home, _ = await chat.turn()
    url, reason = await chat.turn()
    assert url == home and blocks(reason) > 50
    # The home server now answers nothing: what is sent there stays in flight.
    plain().post(home + "/sim/faults", json={"stall": True}, timeout=10).raise_for_status()
    holders = []
    try:
        for i in range(HOLDERS):
            # Other conversations sharing the system prompt go where it is held, as long
            # as the work ahead there is less than what the cache saves them.
            holders.append(asyncio.create_task(hold(prefix_http, "botany", i)))
            deadline = time.monotonic() + 20
            while (await servers_of(prefix_http))[home]["outstanding"] < i + 1:
                assert time.monotonic() < deadline, await servers_of(prefix_http)
                await asyncio.sleep(0.05)
        # The work ahead on the home server is now more than the whole conversation:
        # either idle server starts the next turn sooner (they tie, taken in turn).
        moved, reason = await chat.turn()
        assert moved != home
        assert reason == "rotation"
        assert (await servers_of(prefix_http))[home]["outstanding"] == HOLDERS
    finally:
        for task in holders:
            task.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
        # A prefill that never answers keeps its node until it times out (a KV transfer
        # may still come): the server is killed instead, which ends them, and restarted.
        server = server_at(prefills, home)
        await asyncio.to_thread(server.kill)
        await restarted(prefix_http, server)
        await asyncio.to_thread(gateways["prefix"].wait_all_free)


async def test_a_session_sticks_to_one_server_and_moves_when_it_is_killed(
    session_http: httpx.AsyncClient, prefills: list[KillableServer]
) -> None:
    async def ask(i: int) -> tuple[str, str]:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": directive(f"reply {i}")}],
            "max_tokens": 10,
        }
        reply = await session_http.post(
            "/v1/chat/completions", json=body, headers={"x-session-id": "session-7"}
        )
        assert reply.status_code == 200, reply.text
        url, reason = reply.headers["x-pd-upstream"].split("; reason=")
        return url, reason

    picks = [await ask(i) for i in range(4)]
    home = picks[0][0]
    assert picks == [(home, "session")] * 4
    server = server_at(prefills, home)
    await asyncio.to_thread(server.kill)
    try:
        await until_state(session_http, home, "ejected")
        moved = [await ask(i) for i in range(4, 8)]
        assert moved[0][0] != home
        assert moved == [(moved[0][0], "session")] * 4
    finally:
        await restarted(session_http, server)
