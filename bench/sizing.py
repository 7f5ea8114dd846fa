"""`pd-gateway bench --scenario sizing`: the pools' recommended sizes (router/capacity)
following a load that rises and falls, beside what that load needed.

Requests arrive at random (Poisson) at a rate that steps up and back down, phase by phase:
latency streams on a pool of simulated TileRT nodes (more than any phase needs, so that no
shortage hides the load), native streams in `pull` mode on one prefill and one decode
server. Every second the bench reads the gateway's `/admin/sizing`. What each phase needed
is worked out without the gateway's figures:

* TileRT nodes: Erlang C (the same queue target) on the load the nodes carried, from the
  servers' own records: each request from its prefill's arrival at the prefill server
  (the node is held from before it) to the end of its decode on the node, summed over the
  phase, per second (Little's law: with more nodes than the load keeps busy, the load
  offered), at those requests' mean time;
* prefill servers: the prefill server's own records (each prefill's time, received to
  first token) summed over the phase, per second, over the utilization target;
* decode servers: the requests the decode server ran on average (its records, by Little's
  law), over the most it can run within the gap target by its configured speed.

The table gives, per phase, the rate, what was needed, and the gateway's recommendation at
the phase's end (after the averaging window has had its time) and its range over the
phase's second half.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvloop

from bench.experiments.harness import BenchGateway, latency_model
from router.capacity.erlang import servers_needed
from sim.stack import SimStack

MODEL = "sizing"
BATCH = {"x-workload": "batch"}
POOLS = ("tilert", "prefill", "decode")


@dataclass(frozen=True, slots=True)
class SizingOptions:
    latency_rates: tuple[float, ...] = (2.0, 6.0, 12.0, 6.0, 2.0)
    """Latency requests a second, one phase each."""
    native_rates: tuple[float, ...] = (1.0, 3.0, 6.0, 3.0, 1.0)
    phase_s: float = 30.0
    window_s: float = 10.0
    nodes: int = 12
    answer_words: int = 60
    step_ms: float = 5.0
    """A node's time per token."""
    prefill_ms_per_token: float = 0.5
    decode_itl_ms: float = 5.0
    decode_itl_ms_per_running: float = 1.0
    itl_target_ms: float = 20.0
    prefill_utilization: float = 0.8
    tilert_wait_ms: float = 100.0
    tilert_wait_share: float = 0.05
    one_process: bool = False
    """The simulators served by one process (`SimStack(one_process=True)`): quicker to
    start, their CPU shared."""

    @classmethod
    def quick(cls) -> SizingOptions:
        return cls(
            latency_rates=(2.0, 10.0, 2.0),
            native_rates=(1.0, 5.0, 1.0),
            phase_s=12.0,
            nodes=8,
            one_process=True,
        )

    @property
    def decode_capacity(self) -> int:
        """The most requests the decode server runs within the gap target: its gap is
        `decode_itl_ms` alone and `decode_itl_ms_per_running` more for each other one."""
        room = (self.itl_target_ms - self.decode_itl_ms) / self.decode_itl_ms_per_running
        return 1 + math.floor(room + 1e-9)


@dataclass(slots=True)
class Phase:
    latency_rate: float
    native_rate: float
    start: float = 0.0
    end: float = 0.0
    failed: int = 0
    needed: dict[str, int] = field(default_factory=dict)
    offered: float = 0.0
    """The TileRT pool's offered load (Erlangs), from the nodes' own records."""
    seen: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    """(when, recommended per pool), every reading of /admin/sizing in the phase."""
    offered_seen: float | None = None
    """The gateway's figure for the offered load, at the phase's last reading."""

    @property
    def at_end(self) -> dict[str, int]:
        return self.seen[-1][1] if self.seen else {}

    def second_half(self, pool: str) -> tuple[int, int] | None:
        middle = (self.start + self.end) / 2
        values = [r[pool] for at, r in self.seen if at >= middle and pool in r]
        return (min(values), max(values)) if values else None


def stack_of(options: SizingOptions) -> SimStack:
    per_token = str(options.prefill_ms_per_token)
    return SimStack(
        nodes=options.nodes,
        prefills=1,
        decodes=1,
        model=MODEL,
        one_process=options.one_process,
        node_args=["--step-ms", str(options.step_ms)],
        prefill_args=["--itl-ms", "0", "--prefill-ms-per-token", per_token],
        decode_args=[
            "--itl-ms",
            str(options.decode_itl_ms),
            "--itl-ms-per-running",
            str(options.decode_itl_ms_per_running),
            "--prefill-ms-per-token",
            per_token,
        ],
    )


def gateway_config(stack: SimStack, options: SizingOptions) -> dict[str, Any]:
    model = latency_model(
        stack,
        MODEL,
        throughput={
            "mode": "pull",
            "prefill": [s.url for s in stack.prefills],
            "decode": [s.url for s in stack.decodes],
        },
        sizing={
            "window_s": options.window_s,
            "tilert_wait_ms": options.tilert_wait_ms,
            "tilert_wait_share": options.tilert_wait_share,
            "prefill_utilization": options.prefill_utilization,
            "decode_itl_ms": options.itl_target_ms,
        },
    )
    rules = {
        "default": {"name": "chat", "path": "latency"},
        "rules": [{"name": "batch", "match": {"headers": BATCH}, "path": "throughput"}],
    }
    return {
        "models": [model],
        "classification": {"rules": rules},
        "gate": {"max_queue": 1024, "max_queue_wait_ms": 60_000},
    }


async def answer(http: httpx.AsyncClient, text: str, headers: dict[str, str]) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"[[sim-output]]{text}[[/sim-output]]"}],
        "stream": True,
    }
    async with http.stream("POST", "/chat/completions", json=body, headers=headers) as response:
        if response.status_code != 200:
            raise RuntimeError(f"answered {response.status_code}")
        async for _ in response.aiter_bytes():
            pass


async def arrivals(
    http: httpx.AsyncClient,
    rate: float,
    until: float,
    headers: dict[str, str],
    phase: Phase,
    words: int,
) -> list[asyncio.Task[None]]:
    """Requests at random, `rate` a second on average, until `until` (time.time()), each
    asking for an answer of `words` tokens."""
    rng = random.Random(f"{rate}{headers}")
    text = " ".join(f"w{i % 10}" for i in range(words))
    tasks: list[asyncio.Task[None]] = []

    async def one() -> None:
        try:
            await answer(http, text, headers)
        except (RuntimeError, httpx.HTTPError):
            phase.failed += 1

    while True:
        await asyncio.sleep(rng.expovariate(rate))
        if time.time() >= until:
            return tasks
        tasks.append(asyncio.create_task(one()))


async def watch(
    http: httpx.AsyncClient, admin: str, phases: list[Phase], done: asyncio.Event
) -> None:
    """Every second, the gateway's recommendations, into the phase running."""
    while not done.is_set():
        models = (await http.get(admin)).json()["models"].get(MODEL, {})
        now = time.time()
        recommended = {pool: size["recommended"] for pool, size in models.items()}
        for phase in phases:
            if phase.start <= now < phase.end:
                phase.seen.append((now, recommended))
                if "tilert" in models:
                    phase.offered_seen = models["tilert"]["demand"]
        try:
            await asyncio.wait_for(done.wait(), 1.0)
        except TimeoutError:
            pass


async def run_phases(gateway: BenchGateway, stack: SimStack, options: SizingOptions) -> list[Phase]:
    phases = [Phase(a, b) for a, b in zip(options.latency_rates, options.native_rates, strict=True)]
    base = gateway.base_url.removesuffix("/v1")
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=120, limits=limits) as http:
        done = asyncio.Event()
        watching = asyncio.create_task(watch(http, base + "/admin/sizing", phases, done))
        started = time.time()
        for i, phase in enumerate(phases):
            phase.start = started + i * options.phase_s
            phase.end = phase.start + options.phase_s
        pending: list[asyncio.Task[None]] = []
        for phase in phases:
            latency, native = await asyncio.gather(
                arrivals(http, phase.latency_rate, phase.end, {}, phase, options.answer_words),
                arrivals(http, phase.native_rate, phase.end, BATCH, phase, options.answer_words),
            )
            pending += latency + native
        await asyncio.gather(*pending)
        done.set()
        await watching
        prefill = (await http.get(stack.prefills[0].url + "/sim/requests")).json()["requests"]
        decode = (await http.get(stack.decodes[0].url + "/sim/requests")).json()["requests"]
        sent = {r["rid"]: r["received"] for r in prefill if r.get("rid")}
        holds = [
            hold
            for node in stack.nodes
            for hold in node_holds((await http.get(node.url + "/sim/records")).json(), sent)
        ]
    for phase in phases:
        phase.needed = needed(phase, options, holds, prefill, decode)
    return phases


def node_holds(records: dict[str, Any], prefilled: dict[str, float]) -> list[tuple[float, float]]:
    """(from, to) of each request a node served: from the arrival of its prefill at the
    prefill server (`prefilled`, by rid: the node is held from before it), else from the
    node's acceptance of its KV transfer, to the end of its decode."""
    accepted = {
        r["rid"]: r["time"] for r in records["control"] if r["outcome"] == "accepted" and r["rid"]
    }
    return [
        (prefilled.get(d["rid"], accepted[d["rid"]]), d["end"])
        for d in records["decodes"]
        if d["rid"] in accepted and d["end"] is not None
    ]


def needed(
    phase: Phase,
    options: SizingOptions,
    holds: list[tuple[float, float]],
    prefill: list[dict[str, Any]],
    decode: list[dict[str, Any]],
) -> dict[str, int]:
    seconds = phase.end - phase.start

    def busy_s(records: list[dict[str, Any]], *, first_token: bool) -> float:
        total = 0.0
        for r in records:
            end = (r.get("first_output") if first_token else None) or r.get("finished")
            if end is not None and phase.start <= r["received"] < phase.end:
                total += end - r["received"]
        return total

    held = [end - start for start, end in holds if phase.start <= start < phase.end]
    hold_s = statistics.mean(held) if held else 0.0
    phase.offered = sum(held) / seconds
    prefill_busy = busy_s(prefill, first_token=True) / seconds
    running = busy_s(decode, first_token=False) / seconds
    return {
        "tilert": servers_needed(
            phase.offered,
            hold_s=hold_s or 1.0,
            wait_s=options.tilert_wait_ms / 1e3,
            share=options.tilert_wait_share,
        ),
        "prefill": math.ceil(prefill_busy / options.prefill_utilization - 1e-9),
        "decode": math.ceil(running / options.decode_capacity - 1e-9),
    }


def measure(options: SizingOptions) -> list[Phase]:
    with stack_of(options) as stack, tempfile.TemporaryDirectory(prefix="pd-gw-sizing-") as work:
        gateway = BenchGateway(gateway_config(stack, options), Path(work))
        try:
            gateway.wait_ready()
            return uvloop.run(run_phases(gateway, stack, options))
        finally:
            gateway.stop()


def report(phases: list[Phase], options: SizingOptions, command: str) -> str:
    lines = [
        f"`{command}`: {len(phases)} phases of {options.phase_s:g} s, requests at random"
        f" (Poisson); {options.nodes} TileRT nodes ({options.step_ms:g} ms a token,"
        f" {options.answer_words}-token answers), one prefill server"
        f" ({options.prefill_ms_per_token:g} ms a prompt token) and one decode server"
        f" ({options.decode_itl_ms:g} ms a token, {options.decode_itl_ms_per_running:g} ms more"
        f" for each other request running) in `pull` mode. Targets: at most"
        f" {options.tilert_wait_share:.0%} wait over {options.tilert_wait_ms:g} ms for a node;"
        f" prefill servers {options.prefill_utilization:.0%} busy; decode gap within"
        f" {options.itl_target_ms:g} ms ({options.decode_capacity} running a server). Sizing"
        f" averaged over {options.window_s:g} s. Needed: worked out from the load as generated"
        " and the servers' own records; recommended: the gateway's at the phase's end, and"
        " its range over the phase's second half.",
        "",
        "| phase | latency req/s | native req/s | TileRT Erlangs: load / gateway"
        " | TileRT needed | recommended | range"
        " | prefill needed | recommended | range | decode needed | recommended | range |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, phase in enumerate(phases, 1):
        seen = "-" if phase.offered_seen is None else f"{phase.offered_seen:.2f}"
        cells = [
            str(i),
            f"{phase.latency_rate:g}",
            f"{phase.native_rate:g}",
            f"{phase.offered:.2f} / {seen}",
        ]
        for pool in POOLS:
            span = phase.second_half(pool)
            cells += [
                str(phase.needed.get(pool, "-")),
                str(phase.at_end.get(pool, "-")),
                f"{span[0]}-{span[1]}" if span else "-",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *_target_lines(phases)]
    return "\n".join(lines) + "\n"


def _target_lines(phases: list[Phase]) -> list[str]:
    lines = ["| target | measured | met |", "|---|---|---|"]
    for pool in POOLS:
        off = [
            abs(phase.at_end.get(pool, 0) - phase.needed[pool])
            for phase in phases
            if pool in phase.needed
        ]
        worst = max(off, default=0)
        lines.append(
            f"| {pool}: recommended at each phase's end within 1 of what it needed"
            f" | off by at most {worst} | {'yes' if worst <= 1 else 'no'} |"
        )
    failed = sum(phase.failed for phase in phases)
    lines.append(f"| every request answered | {failed} failed | {'yes' if not failed else 'no'} |")
    return lines


def run_sizing(args: Any, command: str) -> int:
    """`pd-gateway bench --scenario sizing`: measure, print the table, write it to the output
    directory and, with `--report`, into that page."""
    from bench.report import publish

    options = SizingOptions.quick() if args.quick else SizingOptions()
    publish(report(measure(options), options, command), "sizing", Path(args.out), args.report)
    return 0
