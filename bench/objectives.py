"""`pd-gateway bench --scenario objectives`: who gets a TileRT node, by rules fixed at deploy
time or by each request's objective, at a load that rises.

One simulated deployment, timing-faithful where the choice depends on it: 4 TileRT nodes
(a decode step of 5 ms, about 3 tokens, streamed as it comes), a prefill server and two
decode servers in `pull` mode whose prefill time grows with the prompt tokens they do not
hold (prefix caches: the prefill server, which sees every conversation, holds the latest
16k tokens, each decode server what it served, computed or transferred; prefills one at a
time) and whose decode gap grows with the requests they run (8 ms, and 1.5 ms for each
other one).
Three classes of traffic:

* `chat`: interactive answers of 48 tokens (Poisson arrivals), objective `itl_ms: 20`;
* `agents`: multi-turn conversations (each turn after the last answer and a think time),
  their context growing by about 400 tokens a turn, objective `ttft_ms: 400`;
* `batch`: answers of 128 tokens (Poisson arrivals), no objective: the native path.

Policies, each a gateway of its own on the same servers, taking turns at each level:
`static` (today's rules: chat and agents on the latency path, batch native),
`all_latency`, `all_native` (every class split into legs), `conditional` (every class
native, `throughput.conditional` serving a prompt whole where its decode server holds all
but 256 of its tokens) and `objectives` (chat and agents by their objectives, batch native).

Per policy, level and class: objective attainment, TTFT and mean gap p50 and p99; per
policy and level: TileRT node-seconds used (the latency answers' time less their queue
waits, from the gateway's own metrics) and, for `objectives`, the prediction error (the
`x-pd-way` header's prediction against what the client measured).
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvloop

from bench.experiments.harness import GatewayTurns, latency_model, node_entries, share_of
from bench.report import met
from bench.stats import percentile
from sim.stack import NodeInfo, SimStack

MODEL = "objectives"
CLASSES = ("chat", "agents", "batch")
OBJECTIVES = {"chat": {"itl_ms": 20}, "agents": {"ttft_ms": 400}}
WORDS = (
    "apple river stone cloud tiger paper window garden silver rocket orange forest bridge "
    "candle engine harbor island jacket kettle ladder marble needle ocean pencil quartz "
    "rabbit saddle tunnel umbrella valley wagon yellow zebra anchor basket castle dragon"
).split()
# The scenario's targets (docs/benchmarks.md).
TARGET_ATTAINMENT = 0.95
TARGET_NODE_SECONDS_RATIO = 0.7
TARGET_PREDICTION_ERROR = 0.2
TARGET_FOLLOW_UP_RATIO = 0.7


@dataclass(frozen=True, slots=True)
class ObjectivesOptions:
    levels: tuple[int, ...] = (1, 2, 4)
    """Load multipliers: chat 2·L/s, batch 1·L/s, 2·L agent conversations."""
    seconds: float = 15.0
    """How long each level sends."""
    nodes: int = 4
    chat_tokens: int = 48
    batch_tokens: int = 128
    agent_tokens: int = 16
    agent_first_words: int = 1500
    agent_turn_words: int = 300
    think_s: float = 0.5
    prefill_cache_blocks: int = 1024
    """16k tokens: the prefill server, which sees every conversation, holds the latest few;
    each decode server holds the conversations it serves (16 times that)."""
    one_process: bool = False
    """The simulators served by one process (`SimStack(one_process=True)`): quicker to
    start, their CPU shared. Nodes then cost next to nothing: each policy gets `nodes` of
    its own, and a level's gateways start together (`GatewayTurns`)."""

    @classmethod
    def quick(cls) -> ObjectivesOptions:
        return cls(
            levels=(1,),
            seconds=1.0,
            batch_tokens=32,
            agent_first_words=300,
            agent_turn_words=60,
            one_process=True,
        )


POLICIES = ("static", "all_latency", "all_native", "conditional", "objectives")


def rules(policy: str) -> dict[str, Any]:
    """The classification of `policy`: each class named by its `x-workload` header."""

    def rule(name: str, **action: Any) -> dict[str, Any]:
        return {"name": name, "match": {"headers": {"x-workload": name}}, **action}

    latency = {"path": "latency", "max_queue_wait_ms": 60_000}
    native = {"path": "throughput"}
    by_policy = {
        "static": [rule("chat", **latency), rule("agents", **latency), rule("batch", **native)],
        "all_latency": [rule(c, **latency) for c in CLASSES],
        "all_native": [rule(c, **native) for c in CLASSES],
        "conditional": [rule(c, **native) for c in CLASSES],
        "objectives": [
            rule("chat", objective=OBJECTIVES["chat"], max_queue_wait_ms=60_000),
            rule("agents", objective=OBJECTIVES["agents"], max_queue_wait_ms=60_000),
            rule("batch", **native),
        ],
    }
    return {"default": {"name": "other", "path": "throughput"}, "rules": by_policy[policy]}


def gateway_config(stack: SimStack, policy: str, nodes: list[NodeInfo]) -> dict[str, Any]:
    """`policy`'s gateway on the stack's servers and `nodes`."""
    throughput: dict[str, Any] = {
        "mode": "pull",
        "prefill": [p.url for p in stack.prefills],
        "decode": [d.url for d in stack.decodes],
    }
    if policy == "conditional":
        throughput["conditional"] = {"min_uncached_tokens": 256}
    model = latency_model(
        stack,
        MODEL,
        throughput=throughput,
        # What the simulators are: the predictor starts from the truth, then measures.
        objectives={
            "prefill_ms_per_token": 0.05,
            "prefill_base_ms": 5,
            "itl_ms": 8,
            "itl_ms_per_running": 1.5,
            "tilert_itl_ms": 5,
            "handoff_ms": 10,
        },
    )
    model["latency"]["nodes"] = node_entries(nodes)
    return {
        "server": {"expose_upstream": True},
        "logging": {"access_log": False},
        "gate": {"max_queue": 2000, "max_queue_wait_ms": 60_000},
        "classification": {"rules": rules(policy)},
        "models": [model],
    }


@dataclass(slots=True)
class Sample:
    cls: str
    turn: int = 0
    ttft_s: float = math.nan
    gap_s: float = math.nan
    duration_s: float = math.nan
    route: str = ""
    way: str = ""
    predicted_ttft_s: float = math.nan
    predicted_gap_s: float = math.nan
    error: str | None = None

    def met(self) -> bool:
        if self.error is not None:
            return False
        objective = OBJECTIVES.get(self.cls, {})
        if "ttft_ms" in objective and not self.ttft_s * 1e3 <= objective["ttft_ms"]:
            return False
        return not ("itl_ms" in objective and not self.gap_s * 1e3 <= objective["itl_ms"])


@dataclass(slots=True)
class Run:
    policy: str
    level: int
    samples: list[Sample] = field(default_factory=list)
    node_seconds: float = 0.0

    def of(self, cls: str) -> list[Sample]:
        return [s for s in self.samples if s.cls == cls]

    def attainment(self, cls: str) -> float:
        samples = self.of(cls)
        return sum(s.met() for s in samples) / len(samples) if samples else math.nan

    def prediction_errors(self) -> list[float]:
        """|actual − predicted| ÷ actual, over both quantities of every planned answer."""
        errors = []
        for s in self.samples:
            if s.error is None and s.way:
                for actual, predicted in (
                    (s.ttft_s, s.predicted_ttft_s),
                    (s.gap_s, s.predicted_gap_s),
                ):
                    if actual > 0 and math.isfinite(predicted):
                        errors.append(abs(actual - predicted) / actual)
        return errors


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def answer(count: int) -> str:
    """A directive making the simulated model answer `count` short words (~1 token each)."""
    return "[[sim-output]]" + " ".join(f"w{i % 10}" for i in range(count)) + "[[/sim-output]]"


async def send(
    http: httpx.AsyncClient,
    base_url: str,
    sample: Sample,
    messages: list[dict[str, str]],
    tokens: int,
) -> None:
    body = {"model": MODEL, "messages": messages, "max_tokens": tokens + 8, "stream": True}
    sent = time.perf_counter()
    arrivals: list[float] = []
    try:
        async with http.stream(
            "POST", base_url + "/chat/completions", json=body, headers={"x-workload": sample.cls}
        ) as response:
            if response.status_code != 200:
                error = orjson.loads(await response.aread()).get("error") or {}
                sample.error = f"{response.status_code} {error.get('code')}"
                return
            sample.route = response.headers.get("x-pd-route", "")
            _read_plan(sample, response.headers.get("x-pd-way"))
            async for line in response.aiter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    arrivals.append(time.perf_counter())
    except httpx.HTTPError as exc:
        sample.error = type(exc).__name__
        return
    sample.duration_s = time.perf_counter() - sent
    if arrivals:
        sample.ttft_s = arrivals[0] - sent
        if len(arrivals) > 1:
            sample.gap_s = (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)


def _read_plan(sample: Sample, header: str | None) -> None:
    """`x-pd-way: whole; ttft_ms=212; itl_ms=23.5; reason=meets`."""
    if not header:
        return
    way, *fields = (part.strip() for part in header.split(";"))
    values = dict(f.split("=", 1) for f in fields if "=" in f)
    sample.way = way
    sample.predicted_ttft_s = float(values.get("ttft_ms", "nan")) / 1e3
    sample.predicted_gap_s = float(values.get("itl_ms", "nan")) / 1e3


async def poisson(
    http: httpx.AsyncClient,
    base_url: str,
    run: Run,
    cls: str,
    rate: float,
    tokens: int,
    until: float,
    rng: random.Random,
) -> None:
    tasks = []
    while (now := time.perf_counter()) < until:
        sample = Sample(cls)
        run.samples.append(sample)
        messages = [{"role": "user", "content": words(rng, 100) + " " + answer(tokens)}]
        tasks.append(asyncio.create_task(send(http, base_url, sample, messages, tokens)))
        await asyncio.sleep(min(rng.expovariate(rate), max(0.0, until - now)))
    await asyncio.gather(*tasks)


async def conversation(
    http: httpx.AsyncClient,
    base_url: str,
    run: Run,
    options: ObjectivesOptions,
    until: float,
    rng: random.Random,
) -> None:
    history = words(rng, options.agent_first_words)
    messages: list[dict[str, str]] = []
    turn = 0
    while time.perf_counter() < until:
        messages.append({"role": "user", "content": history + " " + answer(options.agent_tokens)})
        sample = Sample("agents", turn=turn)
        run.samples.append(sample)
        await send(http, base_url, sample, messages, options.agent_tokens)
        messages.append({"role": "assistant", "content": "ok " * options.agent_tokens})
        history = words(rng, options.agent_turn_words)
        turn += 1
        await asyncio.sleep(rng.expovariate(1 / options.think_s))


async def one_run(base_url: str, options: ObjectivesOptions, run: Run) -> None:
    rng = random.Random(f"{run.policy}-{run.level}")
    until = time.perf_counter() + options.seconds
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    metrics_url = base_url.removesuffix("/v1") + "/metrics"
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        waited_before = await _queue_waited_s(http, metrics_url)
        level = run.level
        await asyncio.gather(
            poisson(http, base_url, run, "chat", 2 * level, options.chat_tokens, until, rng),
            poisson(http, base_url, run, "batch", level, options.batch_tokens, until, rng),
            *(
                conversation(http, base_url, run, options, until, random.Random(f"{rng.random()}"))
                for _ in range(2 * level)
            ),
        )
        waited = await _queue_waited_s(http, metrics_url) - waited_before
    held = sum(s.duration_s for s in run.samples if s.route == "latency" and s.error is None)
    run.node_seconds = max(0.0, held - waited)


async def _queue_waited_s(http: httpx.AsyncClient, metrics_url: str) -> float:
    """The gateway's granted queue waits so far, in seconds (pd_gateway_queue_wait_seconds)."""
    text = (await http.get(metrics_url)).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("pd_gateway_queue_wait_seconds_sum{") and 'outcome="granted"' in line
    )


@contextmanager
def deployment(options: ObjectivesOptions) -> Iterator[SimStack]:
    caches = ["--enable-prefix-caching", "--block-size", "16", "--serial-prefill"]
    prefill_cache = ["--num-gpu-blocks", str(options.prefill_cache_blocks)]
    stack = SimStack(
        nodes=options.nodes * (len(POLICIES) if options.one_process else 1),
        prefills=1,
        decodes=2,
        model=MODEL,
        one_process=options.one_process,
        # Each decode step's tokens as they come, not 0.1.6's default 200 ms batches: a
        # node's gap is then its step time, which the objectives are about.
        node_args=["--step-ms", "5", "--stream-interval-ms", "5"],
        prefill_args=["--itl-ms", "0", "--prefill-ms-per-token", "0.05", *caches, *prefill_cache],
        decode_args=[
            "--num-gpu-blocks",
            "16384",
            "--itl-ms",
            "8",
            "--itl-ms-per-running",
            "1.5",
            "--prefill-ms-per-token",
            "0.05",
            *caches,
        ],
    )
    with stack:
        yield stack


def measure(options: ObjectivesOptions) -> list[Run]:
    runs = []
    with deployment(options) as stack, tempfile.TemporaryDirectory(prefix="pd-gw-obj-") as workdir:
        shares = len(stack.nodes) // options.nodes
        configs = {
            policy: gateway_config(stack, policy, share_of(stack.nodes, i % shares, shares))
            for i, policy in enumerate(POLICIES)
        }
        for level in options.levels:
            folder = Path(workdir) / f"level-{level}"
            with GatewayTurns(configs, folder, together=options.one_process) as gateways:
                for policy in POLICIES:
                    with gateways.turn(policy) as gateway:
                        for server in [*stack.prefills, *stack.decodes]:
                            httpx.post(server.url + "/sim/reset", json={}, timeout=30)
                        run = Run(policy, level)
                        uvloop.run(one_run(gateway.base_url, options, run))
                        runs.append(run)
    return runs


def _ms(values: list[float], q: float) -> str:
    values = [v for v in values if math.isfinite(v)]
    return f"{percentile(values, q) * 1e3:.0f}" if values else "-"


def report(runs: list[Run], options: ObjectivesOptions, command: str) -> str:
    lines = [
        f"`{command}`: {options.nodes} TileRT nodes, one prefill and two decode servers in pull"
        f" mode; each level L sends chat at 2·L/s, batch at L/s and runs 2·L agent"
        f" conversations for {options.seconds:g} s. Objectives: chat `itl_ms: 20`, agents"
        " `ttft_ms: 400`.",
        "",
        "| level | policy | class | answers | errors | attainment | TTFT p50 ms | TTFT p99 ms"
        " | gap p50 ms | gap p99 ms | on a node |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        for cls in CLASSES:
            samples = run.of(cls)
            ok = [s for s in samples if s.error is None]
            attained = f"{run.attainment(cls):.2f}" if cls in OBJECTIVES else "-"
            on_node = sum(s.route == "latency" for s in ok)
            lines.append(
                f"| {run.level} | {run.policy} | {cls} | {len(samples)}"
                f" | {len(samples) - len(ok)} | {attained}"
                f" | {_ms([s.ttft_s for s in ok], 0.5)} | {_ms([s.ttft_s for s in ok], 0.99)}"
                f" | {_ms([s.gap_s for s in ok], 0.5)} | {_ms([s.gap_s for s in ok], 0.99)}"
                f" | {on_node} |"
            )
    lines += [
        "",
        "| level | policy | node-seconds | prediction error p50 |",
        "|---|---|---|---|",
    ]
    for run in runs:
        errors = run.prediction_errors()
        error = f"{statistics.median(errors):.0%}" if errors else "-"
        lines.append(f"| {run.level} | {run.policy} | {run.node_seconds:.1f} | {error} |")
    lines += ["", *target_lines(runs)]
    return "\n".join(lines) + "\n"


def target_lines(runs: list[Run]) -> list[str]:
    by = {(r.policy, r.level): r for r in runs}
    lines = ["| target | measured | met |", "|---|---|---|"]
    for level in sorted({r.level for r in runs}):
        objectives, static = by.get(("objectives", level)), by.get(("static", level))
        everything = by.get(("all_latency", level))
        if objectives is None:
            continue
        for cls in OBJECTIVES:
            got = objectives.attainment(cls)
            fixed = static.attainment(cls) if static else math.nan
            lines.append(
                f"| level {level}: {cls} attainment ≥ {TARGET_ATTAINMENT} (static rules:"
                f" {fixed:.2f}) | {got:.2f} | {met(got >= TARGET_ATTAINMENT)} |"
            )
        if everything is not None and everything.node_seconds > 0:
            ratio = objectives.node_seconds / everything.node_seconds
            attained = all(objectives.attainment(c) >= everything.attainment(c) for c in OBJECTIVES)
            lines.append(
                f"| level {level}: node-seconds ≤ {TARGET_NODE_SECONDS_RATIO}× all-latency's"
                f" at equal or better attainment | {ratio:.2f}×,"
                f" attainment {'equal or better' if attained else 'worse'}"
                f" | {met(ratio <= TARGET_NODE_SECONDS_RATIO and attained)} |"
            )
        errors = objectives.prediction_errors()
        if errors:
            median = statistics.median(errors)
            lines.append(
                f"| level {level}: median absolute prediction error ≤"
                f" {TARGET_PREDICTION_ERROR:.0%} of the actual | {median:.0%}"
                f" | {met(median <= TARGET_PREDICTION_ERROR)} |"
            )
        split, whole = by.get(("all_native", level)), by.get(("conditional", level))
        if split is not None and whole is not None:
            lines += _conditional_lines(level, split, whole)
    return lines


def _conditional_lines(level: int, split: Run, whole: Run) -> list[str]:
    def ttft(run: Run, follow_up: bool) -> float:
        values = [
            s.ttft_s
            for s in run.of("agents")
            if s.error is None and (s.turn > 0) == follow_up and math.isfinite(s.ttft_s)
        ]
        return statistics.median(values) if values else math.nan

    follow = ttft(whole, True) / ttft(split, True)
    first_whole, first_split = ttft(whole, False), ttft(split, False)
    return [
        f"| level {level}: agents' follow-up TTFT p50, conditional ≤ {TARGET_FOLLOW_UP_RATIO}×"
        f" always-split's | {follow:.2f}× | {met(follow <= TARGET_FOLLOW_UP_RATIO)} |",
        f"| level {level}: agents' first-turn TTFT p50, conditional no worse than always-split"
        f" | {first_whole * 1e3:.0f} vs {first_split * 1e3:.0f} ms"
        f" | {met(first_whole <= first_split * 1.05)} |",
    ]


def run_objectives(args: Any, command: str) -> int:
    """`pd-gateway bench --scenario objectives`: measure, print the tables, write them to the
    output directory and, with `--report`, into that page."""
    from bench.report import publish

    options = ObjectivesOptions.quick() if args.quick else ObjectivesOptions()
    table = report(measure(options), options, command)
    publish(table, "objectives", Path(args.out), args.report)
    return 0
