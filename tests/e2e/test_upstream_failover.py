"""A prefill server killed under load, through a running gateway, then started again.

Three prefill servers, each in its own process, serve a steady stream of concurrent
requests (on the latency path, and in `pull` mode on the throughput path). One of them is
held answering one request (the simulator's `stall` fault) and then SIGKILLed. The request
it held was in flight on it: in doubt, it gets a clear OpenAI-style error. Every request
started after the kill must succeed: sent to the dead server, nothing reached it, so it is
sent again to another; once the dead server is ejected, it is not chosen at all. The
server is then started again on the same port, the gateway's probes let it back, and it
serves requests again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
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
RULES = {
    "default": {"name": "native", "path": "throughput"},
    "rules": [{"name": "fast", "match": {"headers": {"x-workload": "fast"}}, "path": "latency"}],
}
CLIENTS = 4
ROUTES = {
    # workload header: (route, the prefill set in /admin/upstreams)
    "fast": ("latency", "latency:prefill:default"),
    "batch": ("throughput", "pull:prefill"),
}


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    """The TileRT nodes and the decode instances (none of them is killed)."""
    return sim_stacks.get(
        nodes=CLIENTS, prefills=0, decodes=2, model=[MODEL], **version_args("0.1.6")
    )


@pytest.fixture(scope="module")
def prefills() -> Iterator[list[KillableServer]]:
    with killable_servers(3, model=MODEL, args=version_args("0.1.6")["prefill_args"]) as servers:
        yield servers


@pytest.fixture(scope="module")
def gateway(
    stack: SimStack, prefills: list[KillableServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    urls = [p.url for p in prefills]
    model = {
        "name": MODEL,
        "tokenizer": "deepseek",
        "latency": {
            "tilert": "0.1.6",
            "prefill": urls,
            "nodes": [node_entry(n) for n in stack.nodes],
            "max_seq_len": 131072,
        },
        "throughput": {"mode": "pull", "prefill": urls, "decode": [d.url for d in stack.decodes]},
    }
    config = gateway_config(
        [model],
        classification={"rules": RULES},
        server={"expose_upstream": True},
        admin={"api_key": "operator-secret"},
        upstreams={"probe_interval_s": 0.1},
    )
    with running_gateways(tmp_path_factory, {"gateway": config}) as running:
        yield running["gateway"]


@dataclass(frozen=True, slots=True)
class Outcome:
    started: float
    status: int
    error: dict[str, Any] | None
    upstream: str
    text: str
    expected: str


async def one_request(http: httpx.AsyncClient, workload: str, n: int, stream: bool) -> Outcome:
    expected = f"answer {n}"
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": directive(expected)}],
        "max_tokens": 20,
        "stream": stream,
    }
    started = time.monotonic()
    headers = {"x-workload": workload}
    async with http.stream("POST", "/chat/completions", json=body, headers=headers) as reply:
        raw = await reply.aread()
    upstream = reply.headers.get("x-pd-upstream", "")
    if reply.status_code != 200:
        return Outcome(started, reply.status_code, json.loads(raw)["error"], upstream, "", expected)
    if not stream:
        text = json.loads(raw)["choices"][0]["message"]["content"]
        return Outcome(started, 200, None, upstream, text, expected)
    text, error = "", None
    for line in raw.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line.removeprefix("data: "))
        if "error" in event:
            error = event["error"]
        for choice in event.get("choices", []):
            text += choice["delta"].get("content") or ""
    return Outcome(started, 200, error, upstream, text, expected)


class Load:
    """`CLIENTS` clients, each sending one request after another until stopped (half of
    them streaming)."""

    def __init__(self, http: httpx.AsyncClient, workload: str) -> None:
        self.outcomes: list[Outcome] = []
        self._http = http
        self._workload = workload
        self._stop = asyncio.Event()
        self._count = 0
        self._tasks = [asyncio.create_task(self._client(i % 2 == 1)) for i in range(CLIENTS)]

    async def _client(self, stream: bool) -> None:
        while not self._stop.is_set():
            self._count += 1
            outcome = await one_request(self._http, self._workload, self._count, stream)
            self.outcomes.append(outcome)

    def completed_since(self, moment: float) -> list[Outcome]:
        return [o for o in self.outcomes if o.started > moment]

    async def stop(self) -> list[Outcome]:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        return self.outcomes


async def until(what: str, check: Callable[[], Awaitable[bool]], timeout_s: float = 20) -> None:
    """Poll `check` until it holds (at a gentle pace: the load runs meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        await asyncio.sleep(0.05)


def prefill_requests(server: KillableServer) -> int:
    """Completions the server has received since it started."""
    response = plain().get(server.url + "/sim/requests", timeout=10)
    response.raise_for_status()
    return len(response.json()["requests"])


def stall_taken(server: KillableServer) -> bool:
    response = plain().get(server.url + "/sim/faults", timeout=10)
    response.raise_for_status()
    return "stall" not in response.json()["faults"]


@pytest.mark.serial
@pytest.mark.parametrize(("workload", "victim"), [("fast", 0), ("batch", 1)])
async def test_a_killed_prefill_server_costs_only_the_request_in_flight_on_it(
    gateway: GatewayProcess, prefills: list[KillableServer], workload: str, victim: int
) -> None:
    route, set_name = ROUTES[workload]
    server = prefills[victim]
    dead = server.url

    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as http:

        async def state() -> dict[str, Any]:
            reply = await http.get(gateway.url + "/admin/upstreams", headers=ADMIN)
            assert reply.status_code == 200, reply.text
            servers: dict[str, Any] = reply.json()["models"][MODEL][set_name]
            return servers[dead]

        async def state_is(*states: str) -> bool:
            return (await state())["state"] in states

        load = Load(http, workload)
        try:
            # The victim serves its share, then holds the next request it is sent.
            await until("the victim served", lambda: asyncio.to_thread(prefill_requests, server))
            plain().post(server.url + "/sim/faults", json={"stall": True, "count": 1}, timeout=10)
            await until("a request held", lambda: asyncio.to_thread(stall_taken, server))
            await asyncio.to_thread(server.kill)
            killed = time.monotonic()

            await until("the victim ejected", lambda: state_is("ejected"))
            ejected = time.monotonic()

            async def served_after_ejection() -> bool:
                return len(load.completed_since(ejected)) >= 2 * CLIENTS

            await until("requests served past the ejection", served_after_ejection)

            await asyncio.to_thread(server.start)  # the same port
            restarted = time.monotonic()
            await until("the victim let back", lambda: state_is("probation", "healthy"))
            await until(
                "the victim serving again",
                lambda: asyncio.to_thread(lambda: prefill_requests(server) > 0),
            )
            await until("the victim healthy", lambda: state_is("healthy"))
        finally:
            outcomes = await load.stop()

    record = await_state_sync(gateway, set_name, dead)
    assert record["ejections"] >= 1
    assert record["last_failure"] in ("unreachable", "probe_failed", "error")

    before = [o for o in outcomes if o.started < killed]
    after = [o for o in outcomes if o.started > killed]
    # Started after the kill: nothing of theirs can have reached the dead server.
    failed_after = [o for o in after if o.status != 200 or o.error is not None]
    assert not failed_after, failed_after
    assert all(o.text == o.expected for o in after)
    # In flight on it when it died: in doubt, a clear error naming the prefill server, or,
    # on the native path, the decode server's failure to read the KV from it.
    failed = [o for o in before if o.status != 200 or o.error is not None]
    assert 1 <= len(failed) <= CLIENTS, failed
    for outcome in failed:
        assert outcome.status in (200, 502, 504), outcome
        assert outcome.error is not None and outcome.error["message"]
        code, message = outcome.error["code"], outcome.error["message"]
        pull_failed = route == "throughput" and code == "decode_failed" and "KV" in message
        assert code.startswith("prefill_") or pull_failed, outcome
    if route == "latency":
        served_by = {o.upstream.split("; ")[0] for o in after if o.started > restarted}
        assert dead in served_by, "the restarted server serves requests again"
    assert len(after) >= 2 * CLIENTS


def await_state_sync(gateway: GatewayProcess, set_name: str, url: str) -> dict[str, Any]:
    reply = plain().get(gateway.url + "/admin/upstreams", headers=ADMIN, timeout=10)
    reply.raise_for_status()
    servers: dict[str, Any] = reply.json()["models"][MODEL][set_name]
    return servers[url]
