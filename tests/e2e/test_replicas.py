"""Several gateway replicas sharing one TileRT pool through one real Redis (`gate.backend:
redis`): no node is ever double-booked whatever the clients do, the shared queue serves by
priority then arrival across replicas, a replica killed with SIGKILL gives its node back
within the lease TTL, and a Redis outage refuses (or spills) instead of guessing.

Model `ds` is served by all four nodes; model `one` by the last node alone, so that a single
held node makes every `one` request wait in the shared queue. The nodes' own records
(`/sim/records`) are the judge of overlap, not the gateways.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sim.stack import NodeInfo, SimStack
from tests.gate.redis_server import RedisServer, running_redis
from tests.support.classify_fixtures import proxy_throughput
from tests.support.deployment import (
    PRIORITY,
    directive,
    gateway_config,
    latency_model,
    request_decodes,
    sim_get,
    sim_post,
    tier_rules,
)
from tests.support.gateway import GatewayProcess, running_gateways, start_gateway
from tests.support.http import plain
from tests.support.stacks import StackPool
from tests.support.waiting import wait_until

pytestmark = pytest.mark.usefixtures("fresh_sims")

# Long enough that a replica whose event loop a loaded CI machine stalls for a second still
# renews in time: the test asserts that no lease expires under load.
LEASE_TTL_S = 4.0
RENEW_EVERY_S = 0.5
DECODE_WORDS = 150  # under half a second of decoding left after the first text
RULES = tier_rules(
    {
        "name": "spill",
        "path": "latency",
        "on_saturation": "spill",
        "max_queue_wait_ms": 1000,
        "match": {"headers": {"x-tier": "spill"}},
    },
)


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=4,
        prefills=1,
        proxy=True,
        model=["ds", "one"],
        node_args=["--step-ms", "3", "--tokens-per-step", "2"],
        prefill_args=["--itl-ms", "0", "--prefill-ms-per-token", "0"],
        proxy_args=["--itl-ms", "0"],
    )


def replica_config(stack: SimStack, redis: RedisServer, prefix: str) -> dict[str, Any]:
    throughput = {"throughput": proxy_throughput(stack)}
    return gateway_config(
        [
            latency_model(stack, "ds", **throughput),
            latency_model(stack, "one", nodes=stack.nodes[3:], **throughput),
        ],
        gate={
            "backend": "redis",
            "redis": {
                "url": redis.url,
                "key_prefix": prefix,
                "lease_ttl_s": LEASE_TTL_S,
                "renew_every_s": RENEW_EVERY_S,
                "poll_s": 0.2,
            },
            "max_queue": 400,
            "max_queue_wait_ms": 60_000,
        },
        timeouts={"decode_stall_s": 15},  # the blockers below are held at their start
        classification={"rules": RULES},
    )


@pytest.fixture(scope="module")
def config(stack: SimStack, redis: RedisServer) -> dict[str, Any]:
    return replica_config(stack, redis, f"replicas-{uuid.uuid4().hex[:12]}")


@pytest.fixture(scope="module")
def replicas(
    config: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[GatewayProcess]]:
    names = [f"replica-{i}" for i in range(3)]
    with running_gateways(tmp_path_factory, dict.fromkeys(names, config)) as running:
        yield [running[name] for name in names]


# -- checks --------------------------------------------------------------------------------


def assert_no_overlap(nodes: list[NodeInfo]) -> int:
    """Every node's own records: never two decodes at once. Returns the number of decodes."""
    decodes = 0
    for node in nodes:
        records = sim_get(node.url, "/sim/records")
        assert records["max_overlap"] <= 1, f"node {node.url} served two requests at once"
        decodes += len(records["decodes"])
        intervals = sorted((d["start"], d["end"]) for d in records["decodes"])
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert end is not None and end <= start, f"node {node.url}: decodes overlap"
    return decodes


def idle(node: NodeInfo) -> bool:
    return bool(sim_get(node.url, "/decode_status")["status"] == "idle")


def all_quiet(stack: SimStack, replicas: list[GatewayProcess]) -> None:
    """Every node idle, and every replica sees the shared pool with no holder, nobody waiting
    and every node in service."""
    wait_until(lambda: all(idle(n) for n in stack.nodes), what="every node to be idle")
    for gateway in replicas:
        gateway.wait_all_free()
        wait_until(
            lambda g=gateway: all(m["waiting"] == 0 for m in g.pool()["models"].values()),
            what="an empty shared queue",
        )


def waiting(gateway: GatewayProcess, model: str) -> int:
    return int(gateway.pool()["models"][model]["waiting"])


def chat(gateway: GatewayProcess, model: str, tier: str, text: str) -> httpx.Response:
    return plain().post(
        gateway.base_url + "/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": text}]},
        headers={"x-tier": tier},
        timeout=60,
    )


def gate_counters(replicas: list[GatewayProcess]) -> dict[str, float]:
    """The lease counters of `/metrics`, summed over the replicas."""
    totals: dict[str, float] = {}
    for gateway in replicas:
        text = plain().get(gateway.url + "/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.startswith("pd_gateway_gate_lease_"):
                    totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def words(count: int) -> str:
    return " ".join(f"w{i % 10}" for i in range(count))


# -- many clients ----------------------------------------------------------------------------

CLIENTS = 300
FAULTS: list[tuple[int, dict[str, Any]]] = [
    (0, {"decode_500": True}),  # before the first byte: 502 for that request
    (1, {"die_after": 4}),  # mid-decode: an error event in a stream, a 502 otherwise
    (2, {"decode_500": True}),
]


async def one_client(
    http: httpx.AsyncClient, gateway: GatewayProcess, i: int, rng: random.Random
) -> tuple[int, bool, str]:
    """(status, failed after the status was sent, how it went)."""
    stream = i % 2 == 0
    leave_after = rng.randint(1, 6) if stream and rng.random() < 0.3 else None  # 15 % of all
    body = {
        "model": "ds",
        "messages": [{"role": "user", "content": directive(words(rng.randint(8, 40)))}],
        "max_tokens": 100,
        "stream": stream,
    }
    tier = ("high", "mid", "low")[i % 3]
    url = gateway.base_url + "/chat/completions"
    async with http.stream("POST", url, json=body, headers={"x-tier": tier}) as response:
        if response.status_code != 200:
            return response.status_code, False, (await response.aread()).decode()
        if not stream:
            await response.aread()
            return 200, False, "ok"
        lines = 0
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if "error" in json.loads(line[len("data: ") :]):
                return 200, True, line
            lines += 1
            if leave_after is not None and lines >= leave_after:
                return 200, False, "left"  # closing the response disconnects mid-stream
        return 200, False, "ok"


@pytest.mark.serial  # no lease may be lost under its own load: not under another test's too
async def test_many_clients_across_replicas_never_double_book(
    stack: SimStack, replicas: list[GatewayProcess]
) -> None:
    for index, fault in FAULTS:
        sim_post(stack.nodes[index].url, "/sim/faults", {**fault, "count": 1})
    before = gate_counters(replicas)
    rng = random.Random(20261201)
    limits = httpx.Limits(max_connections=CLIENTS + 10, max_keepalive_connections=CLIENTS + 10)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        results = await asyncio.gather(
            *(one_client(http, replicas[i % 3], i, rng) for i in range(CLIENTS))
        )

    failed = [r for r in results if r[0] != 200 or r[1]]
    assert all(status in (502, 504) for status, _, _ in failed if status != 200), failed
    assert len(failed) <= len(FAULTS), failed
    assert sum(how == "left" for _, _, how in results) >= CLIENTS // 10
    for index, _ in FAULTS:  # every fault was met by some request
        assert sim_get(stack.nodes[index].url, "/sim/faults")["faults"] == {}
    await asyncio.to_thread(all_quiet, stack, replicas)
    decodes = assert_no_overlap(stack.nodes)
    assert decodes >= CLIENTS - 2 * len(FAULTS)
    # Every decode held a lease; none was lost under load, no release was stale.
    after = gate_counters(replicas)
    grants = "pd_gateway_gate_lease_grants_total"
    assert after[grants] - before.get(grants, 0) >= decodes
    for lost in ("expiries", "fencing_rejections", "renewal_failures"):
        name = f"pd_gateway_gate_lease_{lost}_total"
        assert after[name] == before.get(name, 0), name


# -- priority then arrival -----------------------------------------------------------------


def received_order(stack: SimStack) -> list[str]:
    """The prompts in the order the prefill server received them: a slot is taken just
    before the prefill is sent, so this is the order of service."""
    requests = sim_get(stack.prefills[0].url, "/sim/requests")["requests"]
    return [
        r["body"]["messages"][0]["content"] for r in sorted(requests, key=lambda r: r["received"])
    ]


def test_shared_queue_serves_priority_then_arrival_across_replicas(
    stack: SimStack, replicas: list[GatewayProcess]
) -> None:
    node = stack.nodes[3]
    sim_post(node.url, "/sim/faults", {"hold_start": True, "count": 1})
    replies: list[httpx.Response] = []
    threads: list[threading.Thread] = []

    def send(gateway: GatewayProcess, tier: str, text: str) -> None:
        thread = threading.Thread(target=lambda: replies.append(chat(gateway, "one", tier, text)))
        thread.start()
        threads.append(thread)

    send(replicas[0], "low", "blocker")
    wait_until(lambda: not idle(node), what="the blocker to hold the node")
    order = ["low", "high", "mid", "low", "high", "mid", "high", "low", "mid"]
    for i, tier in enumerate(order):
        send(replicas[i % 3], tier, f"{tier}-{i}")
        wait_until(lambda n=i + 1: waiting(replicas[0], "one") == n, what=f"{i + 1} waiters")
    assert sim_post(node.url, "/sim/release", {})["released"] == 1  # all queued: go
    for thread in threads:
        thread.join()

    assert [r.status_code for r in replies] == [200] * (len(order) + 1)
    expected = sorted(
        (f"{tier}-{i}" for i, tier in enumerate(order)),
        key=lambda name: (-PRIORITY[name.split("-")[0]], int(name.split("-")[1])),
    )
    assert received_order(stack) == ["blocker", *expected]
    all_quiet(stack, replicas)
    assert_no_overlap([node])


# -- a replica killed mid-stream -----------------------------------------------------------


def test_killed_replica_frees_its_node_within_the_lease_ttl(
    stack: SimStack,
    replicas: list[GatewayProcess],
    config: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    node = stack.nodes[3]
    with start_gateway(tmp_path_factory, config["models"], **_options(config)) as victim:
        body = {
            "model": "one",
            "messages": [{"role": "user", "content": directive(words(DECODE_WORDS))}],
            "max_tokens": 2000,
            "stream": True,
        }
        with (
            httpx.Client(timeout=30) as http,
            http.stream("POST", victim.base_url + "/chat/completions", json=body) as response,
        ):
            assert response.status_code == 200
            lines = response.iter_lines()  # kept open: leaving the loop must not close it
            for line in lines:
                if line.startswith("data: ") and '"content":"w' in line:
                    break  # the node is decoding for the victim (for under a second more)
            else:
                raise AssertionError("the victim's stream ended before its node decoded")
            assert victim.pool()["models"]["one"]["busy"][_node_id(node)] is not None
            victim.kill()
            killed_at = time.time()
            reply = chat(replicas[1], "one", "low", directive("after the kill"))

    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == "after the kill"
    decodes = request_decodes(sim_get(node.url, "/sim/records")["decodes"])
    # Streamed: a request's own decodes (the flush in the victim's name is a one-token call).
    victims, after = [d for d in decodes if d["stream"]]
    # The victim's decode ended on its own before the next began, and the node went to
    # another replica only once the victim's lease had expired (renewed at most
    # renew_every_s before the kill) and a prober had flushed it: never earlier, and within
    # a few seconds (a generous bound: this machine may be busy).
    assert victims["end"] <= after["start"], (victims, after)
    took = after["start"] - killed_at
    assert LEASE_TTL_S - RENEW_EVERY_S - 0.2 <= took <= LEASE_TTL_S + 5.0, took
    all_quiet(stack, replicas)
    assert_no_overlap(stack.nodes)


@pytest.mark.parametrize("holder", ["killed", "paused"])
def test_a_decode_left_running_past_its_lease_is_cancelled_and_its_node_serves_again(
    holder: str,
    stack: SimStack,
    replicas: list[GatewayProcess],
    config: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The victim's node stalls mid-answer (silent until cancelled: a decode that would run
    on for as long as anyone let it) and the victim dies or freezes: the replica that finds
    the lease expired cancels the decode the lease names, and the node serves again at once,
    not when the decode ends (never, here)."""
    node = stack.nodes[3]
    node_id = _node_id(node)
    sim_post(node.url, "/sim/faults", {"stall_after": 6, "count": 1})
    body = {
        "model": "one",
        "messages": [{"role": "user", "content": directive(words(40))}],
        "stream": True,
    }
    watcher = replicas[1]
    cancels_before = lease_expired_cancels(replicas)
    with (
        start_gateway(tmp_path_factory, config["models"], **_options(config)) as victim,
        httpx.Client(timeout=60) as http,
        http.stream("POST", victim.base_url + "/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()  # kept open: leaving the loop must not close it
        for line in lines:
            if line.startswith("data: ") and '"content":"w' in line:
                break  # the node is decoding for the victim, and stalls now
        else:
            raise AssertionError("the victim's stream ended before its node decoded")
        (stalled,) = request_decodes(sim_get(node.url, "/sim/records")["decodes"])
        if holder == "killed":
            victim.kill()
        else:
            victim.pause()
        try:
            wait_until(
                lambda: watcher.pool()["models"]["one"]["out"].get(node_id) == "lease_expired",
                what="the lease to expire",
            )
            wait_until(
                lambda: node_id not in watcher.pool()["models"]["one"]["out"],
                what="the node back in service",
            )
            reply = chat(watcher, "one", "low", directive("served while the holder is gone"))
        finally:
            if holder == "paused":
                victim.resume()
        assert reply.status_code == 200, reply.text
        if holder == "paused":
            # Thawed, the victim finds its lease lost: its client's answer ends, saying so.
            rest = [line for line in lines if line]
            assert rest[-1] == "data: [DONE]", rest[-2:]
            assert '"code":"lease_lost"' in rest[-2], rest[-2:]

    decodes = request_decodes(sim_get(node.url, "/sim/records")["decodes"])
    (cancelled,) = [d for d in decodes if d["rid"] == stalled["rid"] and d["stream"]]
    assert cancelled["finish_reason"] == "cancelled", cancelled
    assert cancelled["n"] == 6
    rids = [d["rid"] for d in decodes]
    # The stale rid reached the node twice: its decode, and the prober's flush in its name.
    assert rids.count(stalled["rid"]) == 2, rids
    all_quiet(stack, replicas)
    assert_no_overlap(stack.nodes)
    assert lease_expired_cancels(replicas) == cancels_before + 1


def lease_expired_cancels(replicas: list[GatewayProcess]) -> float:
    """Decodes the replicas' probers cancelled because their lease had expired, summed."""
    return sum(
        sample.value
        for gateway in replicas
        for family in text_string_to_metric_families(plain().get(gateway.url + "/metrics").text)
        for sample in family.samples
        if sample.name == "pd_gateway_cancellations_total"
        and sample.labels["reason"] == "lease_expired"
    )


def _options(config: dict[str, Any]) -> dict[str, Any]:
    return {k: config[k] for k in ("gate", "timeouts", "classification")}


def _node_id(node: NodeInfo) -> str:
    return f"{node.host}:{node.http_port}"


# -- Redis outage ------------------------------------------------------------------------------


OUTAGE_S = 3 * LEASE_TTL_S  # every lease expires meanwhile, with time to spare
RECOVERY_S = 5.0


@pytest.mark.serial  # recovery within RECOVERY_S, every node readmitted within the wait
def test_redis_outage_refuses_or_spills_then_recovers(
    stack: SimStack, replicas: list[GatewayProcess], redis: RedisServer
) -> None:
    """Runs last in the module. Redis is down for OUTAGE_S (every lease expires meanwhile):
    no answer is a 5xx, latency requests refuse or spill with `gate_unavailable`, /ready
    stays true. It comes back empty: every replica's first request is served (none refused
    by a connection opened to the old server), within RECOVERY_S, each node having been
    seen idle and flushed first."""
    redis.stop()
    stopped_at = time.monotonic()
    answers = 0
    try:
        while time.monotonic() - stopped_at < OUTAGE_S:
            for gateway in replicas:
                refused = chat(gateway, "ds", "low", directive("no gate"))
                assert refused.status_code == 429, refused.text
                assert refused.json()["error"]["code"] == "gate_unavailable"
                assert int(refused.headers["retry-after"]) >= 1
                spilled = chat(gateway, "ds", "spill", directive("spilled"))
                assert spilled.status_code == 200, spilled.text
                assert spilled.headers["x-pd-route"] == "throughput"
                assert spilled.headers["x-pd-reroute-reason"] == "gate_unavailable"
                assert plain().get(gateway.url + "/ready", timeout=5).status_code == 200
                answers += 2
    finally:
        redis.start()
    assert answers >= 6
    restarted_at = time.monotonic()
    for gateway in replicas:  # each replica's first request after the restart is served
        back = chat(gateway, "ds", "low", directive("back"))
        assert back.status_code == 200, back.text
    recovered_s = time.monotonic() - restarted_at
    assert recovered_s <= RECOVERY_S, recovered_s
    all_quiet(stack, replicas)
    assert assert_no_overlap(stack.nodes) >= len(replicas)
