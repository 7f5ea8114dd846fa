"""How good is Retry-After? The 429's estimate against the wait a client actually has.

Starts the simulators (2 TileRT nodes) and `pd-gateway serve`, keeps both nodes busy with
streams of random length (two clients queueing one request after another), and probes:
a request under a `reject` rule gets 429 with `Retry-After: R`; at once the same client
queues a request under a `queue` rule and measures how long it waits for its slot, `W`
(until its first byte, less the prefill). A client that waits R seconds should usually
get in: the report is the distribution of W - R and the share of probes with W <= R.

Run: `python -m bench.experiments.retry_after [--probes N]`.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import time

import httpx
import uvloop

from bench.experiments.harness import latency_model, running_gateways
from sim.stack import SimStack

MODEL = "ds"
NODE_ARGS = ["--step-ms", "10", "--tokens-per-step", "1"]  # 100 tokens/s per stream
RULES = {
    "default": {"name": "queue", "path": "latency", "on_saturation": "queue"},
    "rules": [
        {
            "name": "reject",
            "match": {"headers": {"x-saturation": "reject"}},
            "path": "latency",
            "on_saturation": "reject",
        }
    ],
}


def body(tokens: int) -> dict[str, object]:
    text = " ".join(f"w{i}" for i in range(tokens))
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"[[sim-output]]{text}[[/sim-output]]"}],
        "stream": True,
    }


async def stream(client: httpx.AsyncClient, base_url: str, tokens: int) -> float:
    """Seconds until the first byte of a queued streamed request."""
    started = time.perf_counter()
    first = math.nan
    async with client.stream("POST", base_url + "/chat/completions", json=body(tokens)) as r:
        r.raise_for_status()
        async for _ in r.aiter_bytes():
            if math.isnan(first):
                first = time.perf_counter() - started
    return first


async def background(client: httpx.AsyncClient, base_url: str, stop: asyncio.Event) -> None:
    rng = random.Random(os.getpid())
    while not stop.is_set():
        await stream(client, base_url, rng.randint(50, 400))  # 0.5 to 4 s each


async def measure(base_url: str, probes: int) -> list[tuple[int, float]]:
    results: list[tuple[int, float]] = []
    stop = asyncio.Event()
    async with httpx.AsyncClient(timeout=300) as client:
        baseline = await stream(client, base_url, 5)  # first byte with a free node
        loaders = [asyncio.create_task(background(client, base_url, stop)) for _ in range(2)]
        await asyncio.sleep(2)
        rng = random.Random(0)
        while len(results) < probes:
            refused = await client.post(
                base_url + "/chat/completions", json=body(5), headers={"x-saturation": "reject"}
            )
            if refused.status_code == 429:
                estimate = int(refused.headers["retry-after"])
                waited = await stream(client, base_url, 5) - baseline
                results.append((estimate, waited))
            await asyncio.sleep(rng.uniform(0.2, 1.5))
        stop.set()
        await asyncio.gather(*loaders)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", type=int, default=40)
    args = parser.parse_args()
    with SimStack(nodes=2, prefills=1, model=MODEL, node_args=NODE_ARGS) as stack:
        config = {
            "logging": {"access_log": False},
            "gate": {"max_queue_wait_ms": 120_000},
            "classification": {"rules": RULES},
            "models": [latency_model(stack, MODEL)],
        }
        with running_gateways(config) as gateways:
            base_url = gateways["gateway"].wait_ready()
            results = uvloop.run(measure(base_url, args.probes))
    errors = sorted(waited - estimate for estimate, waited in results)
    within = sum(1 for estimate, waited in results if waited <= estimate)

    def q(p: float) -> float:
        return errors[max(0, math.ceil(p * len(errors)) - 1)]

    print(
        f"{len(results)} probes, 2 nodes held by streams of 0.5-4 s, 2 clients queueing "
        "one after another"
    )
    print(f"Retry-After given: {sorted({e for e, _ in results})} s")
    print(
        f"actual wait - Retry-After (s): p10 {q(0.1):+.2f}  p50 {q(0.5):+.2f}  "
        f"p90 {q(0.9):+.2f}  max {errors[-1]:+.2f}"
    )
    print(f"a client that waits Retry-After gets a slot: {within}/{len(results)}")


if __name__ == "__main__":
    main()
