"""Each path at each concurrency, and the ways its requests are sent (the methods)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import httpx

from bench import batch_latency, handoff
from bench.batch_latency import Relays
from bench.deployment import MODEL, Deployment
from bench.handoff import NodeQueue
from bench.options import BenchOptions
from bench.processes import GatewayChild
from bench.script import Script, make_script
from bench.streams import BenchFailure, Sample, chat_stream, direct_latency
from sim.stack import NodeInfo

Path = Literal["latency", "batched", "ttft", "ttft-batched", "handoff", "native", "capacity"]
DIRECT = "direct"
GATEWAY = "gateway"
PULL_GATEWAY = "gateway-pull"
VLLM_ROUTER = "vllm-router"
BASELINE = "baseline"
BASELINE_PULL = "baseline-pull"
SETTLE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Method:
    """One way of sending a level's requests: `send(worker)`, and the processes that relay
    them (none when nothing does), whose CPU and memory are measured together."""

    label: str
    send: Callable[[int], Awaitable[Sample]]
    pids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Level:
    """One path at one concurrency: each method's rounds of `per_round` requests, each
    round once `settle` says the previous one has left nothing behind; for the hand-off,
    `handoffs` reads the gaps of the round just run; on a batching pool, `relays` pairs the
    round's samples with the lines their nodes wrote."""

    path: Path
    concurrency: int
    pool: int | None  # TileRT nodes behind the gateway (latency path)
    methods: tuple[Method, ...]
    settle: Callable[[], Awaitable[None]]
    per_round: int
    handoffs: Callable[[], Awaitable[list[float]]] | None = None
    relays: Callable[[list[Sample]], Awaitable[Relays]] | None = None


def levels(
    options: BenchOptions, deployment: Deployment, client: httpx.AsyncClient, script: Script
) -> list[Level]:
    stack = deployment.stack
    direct = _direct(client, stack.prefills[0].url, stack.nodes, script)

    async def nodes_idle() -> None:
        await wait_nodes_idle(client, [node.url for node in stack.nodes])

    found = []
    for level in options.latency:
        pool = options.pool_size(level)
        methods = (Method(DIRECT, direct), *_gateways(client, deployment, pool, script))
        found.append(Level("latency", level, pool, methods, nodes_idle, options.per_round(level)))
    found += _batched(options, deployment, client, script)
    found += _first_token(options, deployment, client)
    found += _handoff(options, deployment, client)
    native: tuple[Method, ...] = (
        Method(DIRECT, _chat(client, deployment.proxy_url + "/v1", script, None)),
        _through(client, GATEWAY, deployment.native_gateway, script, "throughput"),
        *_baseline(client, deployment, "native", BASELINE, script, "throughput"),
        _through(client, PULL_GATEWAY, deployment.pull_gateway, script, "throughput"),
        *_baseline(client, deployment, "pull", BASELINE_PULL, script, "throughput"),
    )
    if (router := deployment.vllm_router) is not None:
        native += (
            Method(VLLM_ROUTER, _chat(client, router.base_url, script, None), (router.pid,)),
        )
    for level in options.native_levels:
        found.append(Level("native", level, None, native, _nothing, options.per_round(level)))
    return found + _capacity(options, deployment, client)


def _batched(
    options: BenchOptions, deployment: Deployment, client: httpx.AsyncClient, script: Script
) -> list[Level]:
    """The latency path on the TileRT 0.1.6 pool, whose nodes batch their lines: the first
    token, how long a batch takes from its node to the client, and tokens per second."""
    stack = deployment.batched_stack
    if stack is None:
        return []
    prefill_urls = [server.url for server in deployment.stack.prefills]
    nodes = stack.nodes
    direct = _direct(client, prefill_urls[0], nodes, script, named=True)
    settle = _batched_settled(client, prefill_urls, nodes)

    async def relays(samples: list[Sample]) -> Relays:
        rids = await batch_latency.node_rids(client, prefill_urls)
        return batch_latency.paired(samples, rids, await batch_latency.line_writes(client, nodes))

    found = []
    for level in options.batched:
        pool = options.pool_size(level)
        gateway = deployment.batched_gateways[pool]
        methods = (
            Method(DIRECT, direct),
            _through(client, GATEWAY, gateway, script, "latency", named=True),
            *_baseline(client, deployment, f"batched-{pool}", BASELINE, script, "latency", True),
        )
        per_round = options.per_round(level)
        found.append(Level("batched", level, pool, methods, settle, per_round, None, relays))
    return found


def _first_token(
    options: BenchOptions, deployment: Deployment, client: httpx.AsyncClient
) -> list[Level]:
    """Many short requests at 1 stream and one per node, on each pool: the TTFT targets'
    levels (the latency levels' requests are long, and too few for a p99 of their own)."""
    if not options.first_token:
        return []
    script = make_script(options.ttft_tokens)
    prefill_urls = [server.url for server in deployment.stack.prefills]
    nodes = deployment.stack.nodes[: options.nodes]

    async def nodes_idle() -> None:
        await wait_nodes_idle(client, [node.url for node in nodes])

    direct = Method(DIRECT, _direct(client, prefill_urls[0], nodes, script))
    routed = _gateways(client, deployment, options.nodes, script)
    pools: list[tuple[Path, tuple[Method, ...], Callable[[], Awaitable[None]]]] = [
        ("ttft", (direct, *routed), nodes_idle)
    ]
    if deployment.batched_stack is not None:
        batched = deployment.batched_stack.nodes[: options.nodes]
        gateway = deployment.batched_gateways[options.nodes]
        on_batched = (
            Method(DIRECT, _direct(client, prefill_urls[0], batched, script)),
            _through(client, GATEWAY, gateway, script, "latency"),
            *_baseline(client, deployment, f"batched-{options.nodes}", BASELINE, script, "latency"),
        )
        pools.append(("ttft-batched", on_batched, _batched_settled(client, prefill_urls, batched)))
    found = []
    for path, methods, settle in pools:
        for level in options.first_token:
            per_round = options.per_round(level, options.ttft_requests)
            found.append(Level(path, level, options.nodes, methods, settle, per_round))
    return found


def _direct(
    client: httpx.AsyncClient,
    prefill_url: str,
    nodes: list[NodeInfo],
    script: Script,
    *,
    named: bool = False,
) -> Callable[[int], Awaitable[Sample]]:
    """Direct orchestration: worker i always on node i (one worker per node, so that no
    node is ever double-booked)."""

    async def send(worker: int) -> Sample:
        node = nodes[worker]
        address = (node.host, node.ctrl_port)
        return await direct_latency(
            client, prefill_url, node.url, address, MODEL, script, named=named
        )

    return send


def _gateways(
    client: httpx.AsyncClient, deployment: Deployment, pool: int, script: Script
) -> tuple[Method, ...]:
    """The latency gateway of a pool of `pool` nodes, and `--baseline`'s beside it."""
    gateway = deployment.latency_gateways[pool]
    return (
        _through(client, GATEWAY, gateway, script, "latency"),
        *_baseline(client, deployment, f"latency-{pool}", BASELINE, script, "latency"),
    )


def _through(
    client: httpx.AsyncClient,
    label: str,
    gateway: GatewayChild,
    script: Script,
    route: str,
    named: bool = False,
) -> Method:
    """Requests sent through `gateway`, whose process is measured."""
    return Method(
        label, _chat(client, gateway.base_url, script, route, named=named), (gateway.pid,)
    )


def _baseline(
    client: httpx.AsyncClient,
    deployment: Deployment,
    gateway: str,
    label: str,
    script: Script,
    route: str,
    named: bool = False,
) -> tuple[Method, ...]:
    """`--baseline`'s gateway beside the one labelled `gateway`, if the run has one."""
    earlier = deployment.baseline.get(gateway)
    if earlier is None:
        return ()
    return (_through(client, label, earlier, script, route, named),)


def _batched_settled(
    client: httpx.AsyncClient, prefill_urls: list[str], nodes: list[NodeInfo]
) -> Callable[[], Awaitable[None]]:
    """A TileRT 0.1.6 pool's rounds are over once its nodes are idle, and the records of
    their lines and rids are forgotten."""

    async def settle() -> None:
        await wait_nodes_idle(client, [node.url for node in nodes])
        await batch_latency.forget(client, prefill_urls, nodes)

    return settle


def redis_label(replicas: int) -> str:
    """A hand-off method: the gateway on the Redis gate, with this many replicas."""
    return f"{GATEWAY}-redis" if replicas == 1 else f"{GATEWAY}-redis-{replicas}x"


def _handoff(
    options: BenchOptions, deployment: Deployment, client: httpx.AsyncClient
) -> list[Level]:
    """Short requests from more clients than the pool has nodes: how long a freed node
    waits for its next prefill, through the gateway and with the clients handing nodes to
    each other themselves."""
    if not options.handoff_clients:
        return []
    stack, script = deployment.stack, make_script(options.handoff_tokens)
    nodes = stack.nodes[: options.nodes]
    prefill_url = stack.prefills[0].url
    free = NodeQueue(nodes)

    async def direct(worker: int) -> Sample:
        async def on(node: NodeInfo) -> Sample:
            address = (node.host, node.ctrl_port)
            return await direct_latency(client, prefill_url, node.url, address, MODEL, script)

        sample, waited_s = await free.run(on)
        sample.ttft_s += waited_s  # as a client of the gateway waits in its queue
        return sample

    async def settle() -> None:
        await wait_nodes_idle(client, [node.url for node in nodes])
        await handoff.forget(client, stack, nodes)

    async def handoffs() -> list[float]:
        return await handoff.measured(client, stack, nodes)

    gateway = deployment.latency_gateways[options.nodes]
    methods: tuple[Method, ...] = (
        Method(DIRECT, direct),
        Method(GATEWAY, _chat(client, gateway.base_url, script, "latency"), (gateway.pid,)),
    )
    for replicas, gateways in sorted(deployment.handoff_redis.items()):
        send = _spread(client, gateways, script)
        methods += (Method(redis_label(replicas), send, tuple(g.pid for g in gateways)),)
    methods += _baseline(
        client, deployment, f"latency-{options.nodes}", BASELINE, script, "latency"
    )
    clients = options.handoff_clients
    per_round = options.per_round(clients, options.handoff_requests)
    return [Level("handoff", clients, options.nodes, methods, settle, per_round, handoffs)]


def workers_label(workers: int) -> str:
    """A capacity method: the gateway with this many worker processes."""
    return GATEWAY if workers == 1 else f"{GATEWAY}-{workers}w"


def _capacity(
    options: BenchOptions, deployment: Deployment, client: httpx.AsyncClient
) -> list[Level]:
    """Many slow streams (20 tokens/s) on the native path: how many one gateway relays
    within the gap target, by count of worker processes."""
    if not deployment.capacity_gateways:
        return []
    script = make_script(options.capacity_tokens)
    methods: tuple[Method, ...] = (
        Method(DIRECT, _chat(client, deployment.capacity_url + "/v1", script, None)),
    )
    for workers, gateway in sorted(deployment.capacity_gateways.items()):
        send = _chat(client, gateway.base_url, script, "throughput")
        methods += (Method(workers_label(workers), send, (gateway.pid,)),)
    return [
        Level("capacity", c, None, methods, _nothing, options.per_round(c))
        for c in options.capacity_levels
    ]


def _chat(
    client: httpx.AsyncClient,
    base_url: str,
    script: Script,
    route: str | None,
    *,
    named: bool = False,
) -> Callable[[int], Awaitable[Sample]]:
    async def send(worker: int) -> Sample:
        return await chat_stream(client, base_url, MODEL, script, route, named=named)

    return send


def _spread(
    client: httpx.AsyncClient, gateways: list[GatewayChild], script: Script
) -> Callable[[int], Awaitable[Sample]]:
    """Each worker sends to one replica, the workers spread over them in turn (as a Service
    spreads its clients)."""
    sends = [_chat(client, gateway.base_url, script, "latency") for gateway in gateways]

    async def send(worker: int) -> Sample:
        return await sends[worker % len(sends)](worker)

    return send


async def _nothing() -> None:
    return None


async def wait_nodes_idle(client: httpx.AsyncClient, node_urls: list[str]) -> None:
    """Every node has released its slot: the previous round's decodes have all ended."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    for url in node_urls:
        while (await client.get(url + "/decode_status")).json()["status"] != "idle":
            if time.monotonic() > deadline:
                raise BenchFailure(f"node {url} still busy")
            await asyncio.sleep(0.005)
