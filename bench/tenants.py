"""`pd-gateway bench --scenario tenants`: tenants sharing a pool of TileRT nodes.

One simulated deployment: 4 TileRT nodes (a decode step of 5 ms, tokens streamed as they
come) and a prefill server; every request takes the latency path. Four measures, each on
gateways of their own:

* **A greedy neighbour**: four interactive tenants send short answers (Poisson arrivals)
  alone, then beside one greedy tenant running 32 agent loops of longer answers, with fair
  sharing off (`tenants.fair_share: false`: one queue in arrival order) and on (the greedy
  tenant capped at 3 of the 4 nodes). The interactive tenants' time to first token p99 with
  the neighbour, against theirs alone.
* **Weighted shares**: four tenants of weights 1, 1, 2 and 4, each always with requests
  waiting (16, 8, 4 and 4 agent loops), fair sharing off and on. Jain's fairness index of
  the node-seconds each held (the gateway's `pd_gateway_tenant_node_seconds_total`) divided
  by its weight: 1 is a pool shared exactly by weight.
* **One rate, three replicas**: three gateways on one Redis and a tenant limited to
  `requests_per_minute`; once its minute's allowance is spent, requests sent across the
  replicas at twice the rate: those admitted against the configured rate.
* **The limiter's cost**: `Tenants.admit` for a tenant with a request and a token limit,
  in this process, against a tenant with none: the time per call, in memory and on Redis.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvloop

from bench.experiments.harness import (
    BenchGateway,
    GatewayTurns,
    latency_model,
    node_entries,
    share_of,
)
from bench.objectives import answer
from bench.processes import stop_all
from bench.report import met
from bench.stats import percentile
from demo.redis import LocalRedis
from sim.stack import NodeInfo, SimStack

MODEL = "tenants"
GREEDY = "greedy"
INTERACTIVE = tuple(f"interactive-{i}" for i in range(4))
WEIGHTED = {"w1-a": 1.0, "w1-b": 1.0, "w2": 2.0, "w4": 4.0}
METERED = "metered"
GREEDY_HEAD_START_S = 1.0
_BENCH_PYTHON = sys.executable
# The scenario's targets (docs/benchmarks.md).
TARGET_TTFT_RATIO = 1.5
TARGET_JAIN = 0.95
TARGET_RATE_ERROR = 0.02
TARGET_LIMITER_MEMORY_MS = 0.2
TARGET_LIMITER_REDIS_MS = 0.5


@dataclass(frozen=True, slots=True)
class TenantsOptions:
    nodes: int = 4
    neighbour_seconds: float = 60.0
    """How long each run of the neighbour measure sends (some 240 interactive answers)."""
    seconds: float = 20.0
    """How long each run of the weights measure sends."""
    greedy_loops: int = 32
    greedy_tokens: int = 96
    greedy_caps: tuple[int, ...] = (3, 2, 1)
    """The greedy tenant's `max_nodes` in the runs with fair sharing, one run each."""
    interactive_rate: float = 1.0
    """Each interactive tenant's requests per second."""
    interactive_tokens: int = 16
    weighted_loops: tuple[int, ...] = (16, 8, 4, 4)
    weighted_tokens: int = 48
    rate_per_minute: int = 600
    rate_seconds: float = 20.0
    limiter_calls: int = 2000
    warm_up: int = 12
    """Requests sent to each neighbour run's gateway before it is measured."""
    one_process: bool = False
    """The simulators served by one process (`SimStack(one_process=True)`): quicker to
    start, their CPU shared. Nodes then cost next to nothing: each run of the neighbour and
    weights measures gets `nodes` of its own, and their gateways start together
    (`GatewayTurns`)."""

    @classmethod
    def quick(cls) -> TenantsOptions:
        return cls(
            neighbour_seconds=1.0,
            seconds=1.0,
            greedy_loops=8,
            greedy_caps=(2,),
            weighted_loops=(4, 4, 4, 4),
            rate_per_minute=60,
            rate_seconds=2.0,
            limiter_calls=100,
            warm_up=2,
            one_process=True,
        )


@dataclass(slots=True)
class Sample:
    tenant: str
    ttft_s: float = math.nan
    status: int = 0
    code: str | None = None


@dataclass(slots=True)
class Run:
    name: str
    samples: list[Sample] = field(default_factory=list)
    node_seconds: dict[str, float] = field(default_factory=dict)
    gateway_ttft_ms: list[float] = field(default_factory=list)
    """The interactive answers' time to first token as the gateway's access lines have it
    (from the request's arrival there)."""
    wait_ms: list[float] = field(default_factory=list)
    """The interactive answers' waits for a node (the access lines' `queue_wait_ms`)."""

    def ttft_p99_ms(self, tenants: tuple[str, ...]) -> float:
        values = [s.ttft_s for s in self.samples if s.tenant in tenants and math.isfinite(s.ttft_s)]
        return percentile(values, 0.99) * 1e3 if values else math.nan

    def errors(self) -> int:
        return sum(s.status != 200 for s in self.samples)


@dataclass(slots=True)
class RateResult:
    admitted: int = 0
    refused: int = 0
    seconds: float = 0.0
    per_minute: int = 0

    @property
    def expected(self) -> float:
        return self.per_minute * self.seconds / 60

    @property
    def error(self) -> float:
        return abs(self.admitted - self.expected) / self.expected if self.expected else math.nan


@dataclass(slots=True)
class LimiterCost:
    store: str
    limited_ms: list[float] = field(default_factory=list)
    unlimited_ms: list[float] = field(default_factory=list)
    ping_ms: list[float] = field(default_factory=list)
    """On Redis: a PING on the limiter's own client, the floor of one call."""


# -- the gateways' configuration -------------------------------------------------------------


def gateway_config(
    stack: SimStack,
    tenants: dict[str, Any],
    gate: dict[str, Any] | None = None,
    nodes: list[NodeInfo] | None = None,
) -> dict[str, Any]:
    """A gateway on the stack's prefill server and `nodes` (default: the stack's)."""
    rule = {"name": "latency", "path": "latency", "max_queue_wait_ms": 120_000}
    model = latency_model(stack, MODEL)
    model["latency"]["nodes"] = node_entries(stack.nodes if nodes is None else nodes)
    return {
        "server": {"expose_upstream": True},
        "logging": {"access_log": False},
        "gate": {"max_queue": 4000, "max_queue_wait_ms": 120_000, **(gate or {})},
        "classification": {"rules": {"default": rule}},
        "tenants": {"identify": ["user"], **tenants},
        "models": [model],
    }


def neighbour_tenants(cap: int | None) -> dict[str, Any]:
    """Fair sharing with the greedy tenant capped at `cap` nodes; None: fair sharing off."""
    named: dict[str, Any] = {name: {} for name in INTERACTIVE}
    named[GREEDY] = {} if cap is None else {"max_nodes": cap}
    return {"fair_share": cap is not None, "named": named}


def weighted_tenants(*, fair: bool) -> dict[str, Any]:
    return {"fair_share": fair, "named": {name: {"weight": w} for name, w in WEIGHTED.items()}}


# -- the clients ---------------------------------------------------------------------------


async def send(http: httpx.AsyncClient, base_url: str, sample: Sample, tokens: int) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": answer(tokens)}],
        "max_tokens": tokens + 8,
        "stream": True,
        "user": sample.tenant,
    }
    sent = time.perf_counter()
    try:
        async with http.stream("POST", base_url + "/chat/completions", json=body) as response:
            sample.status = response.status_code
            if response.status_code != 200:
                sample.code = (await response.aread()).decode(errors="replace")[:200]
                return
            async for line in response.aiter_lines():
                if math.isnan(sample.ttft_s) and line.startswith("data: {") and '"content"' in line:
                    sample.ttft_s = time.perf_counter() - sent
    except httpx.HTTPError as exc:
        sample.code = type(exc).__name__


async def loop(
    http: httpx.AsyncClient, base_url: str, run: Run, tenant: str, tokens: int, until: float
) -> None:
    """An agent: one request after another, until `until`."""
    while time.perf_counter() < until:
        sample = Sample(tenant)
        run.samples.append(sample)
        await send(http, base_url, sample, tokens)


async def poisson(
    http: httpx.AsyncClient,
    base_url: str,
    run: Run,
    tenant: str,
    rate: float,
    tokens: int,
    until: float,
    rng: random.Random,
) -> None:
    tasks = []
    while (now := time.perf_counter()) < until:
        sample = Sample(tenant)
        run.samples.append(sample)
        tasks.append(asyncio.create_task(send(http, base_url, sample, tokens)))
        await asyncio.sleep(min(rng.expovariate(rate), max(0.0, until - now)))
    await asyncio.gather(*tasks)


def client() -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    return httpx.AsyncClient(timeout=300, limits=limits)


async def neighbour_run(
    base_url: str, options: TenantsOptions, run: Run, greedy: ProcessPoolExecutor | None
) -> None:
    """The interactive tenants from this process; with `greedy` (a process of its own, so
    that reading its streams does not hold up this one's clock), the greedy one's loops."""
    rng = random.Random(run.name)
    async with client() as http:
        for _ in range(options.warm_up):  # as a tenant of its own: connections open, encodings done
            await send(http, base_url, Sample("warm-up"), options.interactive_tokens)
        neighbour = None
        if greedy is not None:
            neighbour = asyncio.get_running_loop().run_in_executor(
                greedy, greedy_loops, base_url, options
            )
            await asyncio.sleep(GREEDY_HEAD_START_S)  # its loops under way first
        until = time.perf_counter() + options.neighbour_seconds
        await asyncio.gather(
            *(
                poisson(
                    http,
                    base_url,
                    run,
                    tenant,
                    options.interactive_rate,
                    options.interactive_tokens,
                    until,
                    random.Random(f"{tenant}-{rng.random()}"),
                )
                for tenant in INTERACTIVE
            )
        )
        if neighbour is not None:
            run.samples += await neighbour


@contextmanager
def greedy_process() -> Iterator[ProcessPoolExecutor]:
    """The process the greedy tenant's loops run in, for every run beside it: started now
    (its interpreter and imports take a second or more), so that its loops start as soon as
    a run asks, and its head start is its own."""
    with ProcessPoolExecutor(1, mp_context=_own_python()) as pool:
        pool.submit(_started)
        yield pool


def _started() -> None:
    """Nothing: a task that starts the greedy tenant's process and its imports."""


def _own_python() -> BaseContext:
    """Processes started with this process's interpreter (not whatever `sys.executable` says
    by the time they start: the gateways may run on another)."""
    context = multiprocessing.get_context("spawn")
    context.set_executable(_BENCH_PYTHON)
    return context


def greedy_loops(base_url: str, options: TenantsOptions) -> list[Sample]:
    """The greedy tenant's agent loops for as long as a run, in a process of their own."""

    async def loops() -> list[Sample]:
        run = Run(GREEDY)
        until = time.perf_counter() + GREEDY_HEAD_START_S + options.neighbour_seconds
        async with client() as http:
            await asyncio.gather(
                *(
                    loop(http, base_url, run, GREEDY, options.greedy_tokens, until)
                    for _ in range(options.greedy_loops)
                )
            )
        return run.samples

    return uvloop.run(loops())


async def weighted_run(base_url: str, options: TenantsOptions, run: Run) -> None:
    until = time.perf_counter() + options.seconds
    async with client() as http:
        before = await node_seconds(http, base_url)
        await asyncio.gather(
            *(
                loop(http, base_url, run, tenant, options.weighted_tokens, until)
                for tenant, loops in zip(WEIGHTED, options.weighted_loops, strict=True)
                for _ in range(loops)
            )
        )
        after = await node_seconds(http, base_url)
    run.node_seconds = {t: after.get(t, 0.0) - before.get(t, 0.0) for t in WEIGHTED}


async def node_seconds(http: httpx.AsyncClient, base_url: str) -> dict[str, float]:
    """Each tenant's node time so far (pd_gateway_tenant_node_seconds_total)."""
    text = (await http.get(base_url.removesuffix("/v1") + "/metrics")).text
    held = {}
    for line in text.splitlines():
        if line.startswith("pd_gateway_tenant_node_seconds_total{"):
            labels, value = line.rsplit(" ", 1)
            tenant = labels.split('tenant="', 1)[1].split('"', 1)[0]
            held[tenant] = float(value)
    return held


def read_access_lines(run: Run, log_path: Path) -> None:
    """The interactive answers' times as the gateway logged them (JSON access lines)."""
    for line in log_path.read_text(encoding="utf-8").splitlines():
        if '"pd_gateway.access"' not in line:
            continue
        record = orjson.loads(line)
        if record.get("tenant") in INTERACTIVE and record.get("status") == 200:
            if record.get("ttft_ms") is not None:
                run.gateway_ttft_ms.append(record["ttft_ms"])
            run.wait_ms.append(record.get("queue_wait_ms") or 0.0)


def jain(run: Run) -> float:
    """Jain's fairness index of node-seconds divided by weight: 1 when shared by weight."""
    shares = [run.node_seconds[t] / w for t, w in WEIGHTED.items()]
    total = sum(shares)
    squares = sum(x * x for x in shares)
    return total * total / (len(shares) * squares) if squares else math.nan


async def rate_run(base_urls: list[str], options: TenantsOptions) -> RateResult:
    """Spend the tenant's minute, then send at twice its rate across the replicas."""
    result = RateResult(per_minute=options.rate_per_minute)
    async with client() as http:
        for i in range(options.rate_per_minute * 2):
            sample = Sample(METERED)
            await send(http, base_urls[i % len(base_urls)], sample, 1)
            if sample.status == 429:
                break
        else:
            raise RuntimeError("the metered tenant was never refused")
        interval_s = 60 / options.rate_per_minute / 2
        samples: list[Sample] = []
        tasks = []
        started = time.perf_counter()
        for i in range(int(options.rate_seconds / interval_s)):
            await asyncio.sleep(max(0.0, started + i * interval_s - time.perf_counter()))
            samples.append(Sample(METERED))
            base_url = base_urls[i % len(base_urls)]
            tasks.append(asyncio.create_task(send(http, base_url, samples[-1], 1)))
        result.seconds = time.perf_counter() - started
        await asyncio.gather(*tasks)
    result.admitted = sum(s.status == 200 for s in samples)
    result.refused = sum(s.status == 429 for s in samples)
    return result


# -- the limiter, in process ----------------------------------------------------------------


async def limiter_cost(store: str, redis_url: str | None, calls: int) -> LimiterCost:
    from router.config import RedisGateConfig, TenantsConfig
    from router.gate.redis.client import connect
    from router.telemetry.metrics import Metrics
    from router.tenants.admission import Tenants
    from router.tenants.limiter import Limiter, MemoryLimiter
    from router.tenants.redis_limiter import RedisLimiter

    config = TenantsConfig(
        identify=["user"],
        named={"limited": {"requests_per_minute": 10**9, "tokens_per_minute": 10**12}},
    )
    limiter: Limiter = MemoryLimiter()
    client = None
    if redis_url is not None:
        client = connect(RedisGateConfig(url=redis_url), None, max_connections=8)
        limiter = RedisLimiter(client, "tenants-bench", max_calls=8)
    background: set[asyncio.Task[None]] = set()

    def spawn(coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        background.add(task)
        task.add_done_callback(background.discard)

    tenants = Tenants(config, limiter, Metrics(), spawn)
    cost = LimiterCost(store)
    try:
        for _ in range(50):  # warm: scripts loaded, connections open
            await tenants.admit("limited", 100)
        for i in range(calls):
            name, into = ("limited", cost.limited_ms) if i % 2 == 0 else ("free", cost.unlimited_ms)
            started = time.perf_counter()
            await tenants.admit(name, 100)
            into.append((time.perf_counter() - started) * 1e3)
            if client is not None and i % 2 == 0:
                started = time.perf_counter()
                await client.run(lambda redis: redis.ping())
                cost.ping_ms.append((time.perf_counter() - started) * 1e3)
        if background:
            await asyncio.wait(background)
    finally:
        await tenants.close()
    return cost


# -- the whole scenario ---------------------------------------------------------------------


@dataclass(slots=True)
class Results:
    neighbour: list[Run] = field(default_factory=list)
    weighted: list[Run] = field(default_factory=list)
    rate: RateResult | None = None
    limiter: list[LimiterCost] = field(default_factory=list)


def neighbour_runs(options: TenantsOptions) -> list[tuple[str, int | None, bool]]:
    """Each run of the neighbour measure: its name, the greedy tenant's cap (None: fair
    sharing off) and whether the greedy tenant runs beside the interactive ones."""
    return [
        ("alone", options.nodes, False),
        ("shared", None, True),
        *((f"fair, cap {cap}", cap, True) for cap in options.greedy_caps),
    ]


WEIGHTED_RUNS = [("weights off", False), ("weights on", True)]
"""Each run of the weights measure: its name and whether sharing is fair."""


@contextmanager
def deployment(options: TenantsOptions) -> Iterator[SimStack]:
    runs = len(neighbour_runs(options)) + len(WEIGHTED_RUNS)
    stack = SimStack(
        nodes=options.nodes * (runs if options.one_process else 1),
        prefills=1,
        model=MODEL,
        one_process=options.one_process,
        node_args=["--step-ms", "5", "--stream-interval-ms", "5"],
        prefill_args=["--itl-ms", "0", "--prefill-ms-per-token", "0.02"],
    )
    with stack:
        yield stack


def measure(options: TenantsOptions) -> Results:
    results = Results()
    with (
        deployment(options) as stack,
        tempfile.TemporaryDirectory(prefix="pd-gw-tenants-") as workdir,
        greedy_process() as greedy,
    ):
        folder = Path(workdir)
        neighbour = neighbour_runs(options)
        labels = [name for name, _, _ in neighbour] + [name for name, _ in WEIGHTED_RUNS]
        shares = len(stack.nodes) // options.nodes
        own = {label: share_of(stack.nodes, i % shares, shares) for i, label in enumerate(labels)}
        configs: dict[str, dict[str, Any]] = {}
        for name, cap, _ in neighbour:
            configs[name] = gateway_config(stack, neighbour_tenants(cap), nodes=own[name])
            configs[name]["logging"] = {"access_log": True, "format": "json"}
        for name, fair in WEIGHTED_RUNS:
            configs[name] = gateway_config(stack, weighted_tenants(fair=fair), nodes=own[name])
        info = {name: "info" for name, _, _ in neighbour}
        together = options.one_process
        with GatewayTurns(configs, folder, together=together, log_levels=info) as turns:
            for name, _, beside in neighbour:
                run = Run(name)
                with turns.turn(name) as gateway:
                    uvloop.run(
                        neighbour_run(gateway.base_url, options, run, greedy if beside else None)
                    )
                    results.neighbour.append(run)
                read_access_lines(run, gateway.log_path)
            for name, _ in WEIGHTED_RUNS:
                with turns.turn(name) as gateway:
                    run = Run(name)
                    uvloop.run(weighted_run(gateway.base_url, options, run))
                    results.weighted.append(run)
        redis = LocalRedis()
        redis.start()
        try:
            gate = {"backend": "redis", "redis": {"url": redis.url, "key_prefix": "rate"}}
            metered = {"named": {METERED: {"requests_per_minute": options.rate_per_minute}}}
            config = gateway_config(stack, metered, gate, own[labels[0]])
            with _gateways(config, folder / "rate", 3) as base_urls:
                results.rate = uvloop.run(rate_run(base_urls, options))
            results.limiter = [
                uvloop.run(limiter_cost("memory", None, options.limiter_calls)),
                uvloop.run(limiter_cost("redis", redis.url, options.limiter_calls)),
            ]
        finally:
            redis.close()
    return results


@contextmanager
def _gateways(config: dict[str, Any], workdir: Path, count: int) -> Iterator[list[str]]:
    gateways = [BenchGateway(config, workdir / f"replica-{i}") for i in range(count)]
    try:
        yield [gateway.wait_ready() for gateway in gateways]
    finally:
        stop_all(gateways)


# -- the report -----------------------------------------------------------------------------


def report(results: Results, options: TenantsOptions, command: str) -> str:
    lines = [
        f"`{command}`: {options.nodes} TileRT nodes and a prefill server; four interactive"
        f" tenants at {options.interactive_rate:g} request/s each ({options.interactive_tokens}"
        f" tokens), a greedy tenant of {options.greedy_loops} agent loops"
        f" ({options.greedy_tokens} tokens), {options.neighbour_seconds:g} s a run: alone,"
        " beside the greedy tenant with fair sharing off (`shared`), and with it on and the"
        " greedy tenant"
        " capped (`fair, cap N`). TTFT as the client measured it, and as the gateway's access"
        " lines have it (from the request's arrival there), with its wait for a node.",
        "",
        "| run | answers | errors | interactive TTFT p50 ms | p99 ms | at the gateway p99 ms"
        " | wait for a node p99 ms | waited | greedy answers |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in results.neighbour:
        interactive = [
            s.ttft_s for s in run.samples if s.tenant in INTERACTIVE and math.isfinite(s.ttft_s)
        ]
        p50 = percentile(interactive, 0.5) * 1e3 if interactive else math.nan
        greedy = sum(s.tenant == GREEDY and s.status == 200 for s in run.samples)
        waited = sum(w > 1.0 for w in run.wait_ms)
        lines.append(
            f"| {run.name} | {len(run.samples)} | {run.errors()} | {p50:.0f}"
            f" | {run.ttft_p99_ms(INTERACTIVE):.0f} | {_p99(run.gateway_ttft_ms):.0f}"
            f" | {_p99(run.wait_ms):.0f} | {waited} of {len(run.wait_ms)} | {greedy} |"
        )
    lines += [
        "",
        f"Weighted shares: tenants of weights {', '.join(f'{w:g}' for w in WEIGHTED.values())}"
        f" with {', '.join(map(str, options.weighted_loops))} agent loops"
        f" ({options.weighted_tokens} tokens).",
        "",
        "| run | " + " | ".join(f"{t} node-s" for t in WEIGHTED) + " | Jain index |",
        "|---|" + "---|" * len(WEIGHTED) + "---|",
    ]
    for run in results.weighted:
        held = " | ".join(f"{run.node_seconds.get(t, 0.0):.1f}" for t in WEIGHTED)
        lines.append(f"| {run.name} | {held} | {jain(run):.3f} |")
    rate = results.rate
    if rate is not None:
        lines += [
            "",
            f"One rate, three replicas on one Redis: `requests_per_minute: {rate.per_minute}`,"
            f" sent at twice the rate for {rate.seconds:.1f} s once the minute was spent:"
            f" {rate.admitted} admitted, {rate.refused} refused, {rate.expected:.1f} expected.",
        ]
    lines += [
        "",
        "| limiter | limited p50 ms | limited p99 ms | unlimited p50 ms | added p50 ms"
        " | a PING p50 ms |",
        "|---|---|---|---|---|---|",
    ]
    for cost in results.limiter:
        limited = percentile(cost.limited_ms, 0.5)
        free = percentile(cost.unlimited_ms, 0.5)
        ping = f"{percentile(cost.ping_ms, 0.5):.3f}" if cost.ping_ms else "-"
        lines.append(
            f"| {cost.store} | {limited:.3f} | {percentile(cost.limited_ms, 0.99):.3f}"
            f" | {free:.3f} | {limited - free:.3f} | {ping} |"
        )
    lines += ["", *target_lines(results)]
    return "\n".join(lines) + "\n"


def target_lines(results: Results) -> list[str]:
    lines = ["| target | measured | met |", "|---|---|---|"]
    by = {r.name: r for r in results.neighbour}
    if "alone" in by:
        alone = by["alone"]
        client, gateway = alone.ttft_p99_ms(INTERACTIVE), _p99(alone.gateway_ttft_ms)
        for run in results.neighbour:
            if run.name == "alone":
                continue
            ratio = run.ttft_p99_ms(INTERACTIVE) / client
            at_gateway = _p99(run.gateway_ttft_ms) / gateway
            lines.append(
                f"| {run.name}: interactive TTFT p99 beside the greedy tenant ≤"
                f" {TARGET_TTFT_RATIO}× alone | {ratio:.2f}× (at the gateway {at_gateway:.2f}×)"
                f" | {met(ratio <= TARGET_TTFT_RATIO)} |"
            )
    weighted = {r.name: r for r in results.weighted}
    if "weights on" in weighted:
        index = jain(weighted["weights on"])
        off = jain(weighted["weights off"]) if "weights off" in weighted else math.nan
        lines.append(
            f"| Jain's index of weight-normalised node-seconds ≥ {TARGET_JAIN}"
            f" (fair sharing off: {off:.2f}) | {index:.3f} | {met(index >= TARGET_JAIN)} |"
        )
    if results.rate is not None:
        error = results.rate.error
        lines.append(
            f"| three replicas admit within {TARGET_RATE_ERROR:.0%} of the configured rate"
            f" | {error:.1%} off | {met(error <= TARGET_RATE_ERROR)} |"
        )
    targets = {"memory": TARGET_LIMITER_MEMORY_MS, "redis": TARGET_LIMITER_REDIS_MS}
    for cost in results.limiter:
        added = percentile(cost.limited_ms, 0.5) - percentile(cost.unlimited_ms, 0.5)
        target = targets[cost.store]
        lines.append(
            f"| the limiter adds ≤ {target} ms p50 ({cost.store}) | {added:.3f} ms"
            f" | {met(added <= target)} |"
        )
    return lines


def _p99(values: list[float]) -> float:
    return percentile(values, 0.99) if values else math.nan


def run_tenants(args: Any, command: str) -> int:
    """`pd-gateway bench --scenario tenants`: measure, print the tables, write them to the
    output directory and, with `--report`, into that page."""
    from bench.report import publish

    options = TenantsOptions.quick() if args.quick else TenantsOptions()
    table = report(measure(options), options, command)
    publish(table, "tenants", Path(args.out), args.report)
    return 0
