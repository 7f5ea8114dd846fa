"""Can a hostile client slow the normal streams beside it? The same streams alone, then
alongside a client that sends bodies built to cost the gateway the most.

Starts the simulators and `pd-gateway serve` (rules that make it count long prompts), then
alternates rounds of C concurrent streamed latency requests, first alone, then while a
hostile client sends as fast as it gets answers: 8 MB prompts the rules must count, bodies
with 100,000 stop strings, JSON nested 600 deep, 10,000 messages, token ids past the
vocabulary, and garbage. Reported per phase: inter-chunk gap p50/p99/max of the normal
streams and their TTFT, the hostile requests answered and their statuses, and the
gateway's peak resident memory.

Run: `python -m bench.experiments.hostile_mix [--rounds R] [--concurrency C]`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import random
import time
from collections import Counter
from typing import Any

import httpx
import orjson
import uvloop

from bench.experiments.harness import BenchGateway, latency_model, running_gateways
from sim.stack import SimStack

MODEL = "ds"
NODE_ARGS = ["--step-ms", "5", "--tokens-per-step", "2"]
STREAM_TOKENS = 300


RULES = {
    "default": {"name": "interactive", "path": "latency"},
    "rules": [
        {
            "name": "long",
            "match": {"prompt_tokens": {"min": 150_000, "max": 250_000}},
            "path": "throughput",
        }
    ],
}


def hostile_bodies() -> list[tuple[str, bytes, str]]:
    """(name, body, path) of each hostile request."""
    chat: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
    }
    nested = b'{"model": "ds", "metadata": ' + b"[" * 600 + b"]" * 600 + b"}"
    return [
        (
            "8 MB prompt",
            orjson.dumps({**chat, "messages": [{"role": "user", "content": "hello " * 1_400_000}]}),
            "/chat/completions",
        ),
        ("100k stops", orjson.dumps({**chat, "stop": ["x"] * 100_000}), "/chat/completions"),
        ("deep JSON", nested, "/chat/completions"),
        (
            "10k messages",
            orjson.dumps({**chat, "messages": chat["messages"] * 10_000}),
            "/chat/completions",
        ),
        ("bad token ids", orjson.dumps({"model": MODEL, "prompt": [10**9] * 1000}), "/completions"),
        ("garbage", os.urandom(64 * 1024), "/chat/completions"),
    ]


async def stream(client: httpx.AsyncClient, base_url: str) -> tuple[float, list[float]]:
    """One streamed latency request: its TTFT and the gaps between its chunks (s)."""
    text = " ".join(f"w{i}" for i in range(STREAM_TOKENS))
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"[[sim-output]]{text}[[/sim-output]]"}],
        "stream": True,
    }
    started = time.perf_counter()
    arrivals: list[float] = []
    async with client.stream("POST", base_url + "/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"content":"' in line:
                arrivals.append(time.perf_counter())
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    return arrivals[0] - started, gaps


async def hostile(
    client: httpx.AsyncClient, base_url: str, stop: asyncio.Event, seen: Counter[str]
) -> None:
    bodies = hostile_bodies()
    rng = random.Random(0)
    while not stop.is_set():
        name, body, path = rng.choice(bodies)
        response = await client.post(
            base_url + path, content=body, headers={"content-type": "application/json"}
        )
        seen[f"{name}: {response.status_code}"] += 1


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1e3


async def measure(args: argparse.Namespace, gateway: BenchGateway, nodes: int) -> None:
    limits = httpx.Limits(max_connections=64)
    phases: dict[str, tuple[list[float], list[float]]] = {
        "alone": ([], []),
        "with hostile": ([], []),
    }
    seen: Counter[str] = Counter()
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await asyncio.gather(*(stream(client, gateway.base_url) for _ in range(args.concurrency)))
        for _ in range(args.rounds):
            for phase in phases:
                stop = asyncio.Event()
                attacker = (
                    asyncio.create_task(hostile(client, gateway.base_url, stop, seen))
                    if phase == "with hostile"
                    else None
                )
                results = await asyncio.gather(
                    *(stream(client, gateway.base_url) for _ in range(args.concurrency))
                )
                stop.set()
                if attacker is not None:
                    await attacker
                for ttft, gaps in results:
                    phases[phase][0].append(ttft)
                    phases[phase][1].extend(gaps)
    print(
        f"{args.rounds} rounds of {args.concurrency} streams x {STREAM_TOKENS} tokens per phase; "
        f"{nodes} sim nodes ({' '.join(NODE_ARGS)})"
    )
    print(
        f"{'phase':<14}{'gap p50':>9}{'gap p99':>9}{'gap max':>9}{'TTFT p50':>10}{'TTFT p99':>10}"
    )
    for phase, (ttfts, gaps) in phases.items():
        print(
            f"{phase:<14}{pct(gaps, 0.5):9.2f}{pct(gaps, 0.99):9.2f}{max(gaps) * 1e3:9.2f}"
            f"{pct(ttfts, 0.5):10.1f}{pct(ttfts, 0.99):10.1f}"
        )
    print(
        "ms; hostile requests answered: " + ", ".join(f"{k} x{v}" for k, v in sorted(seen.items()))
    )
    print(f"gateway peak RSS: {gateway.peak_rss_mb():.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4, help="also the number of nodes")
    args = parser.parse_args()
    with (
        SimStack(
            nodes=args.concurrency,
            prefills=1,
            proxy=True,
            model=MODEL,
            node_args=NODE_ARGS,
            proxy_args=["--max-model-len", "262144"],
        ) as stack,
    ):
        assert stack.proxy is not None
        model = latency_model(stack, MODEL, throughput={"mode": "proxy", "urls": [stack.proxy.url]})
        config = {
            "logging": {"access_log": False},
            "classification": {"rules": RULES},
            "models": [model],
        }
        with running_gateways(config) as gateways:
            gateway = gateways["gateway"]
            gateway.wait_ready()
            uvloop.run(measure(args, gateway, len(stack.nodes)))


if __name__ == "__main__":
    main()
