"""`pd-gateway bench --scenario agents`: how the choice of prefill server changes time to
first token for multi-turn agent conversations.

Each conversation sends its whole history every turn (earlier user messages and answers)
plus a new user message, its context growing from `first_words` to about
`first_words + (turns - 1) * turn_words` words; the conversations run side by side, each
turn after the previous one's answer and a think time. They are streamed requests on the
latency path of a gateway in front of simulated vLLM prefill servers with a prefix cache
whose prefills take turns (`--serial-prefill`: a compute-bound GPU) and cost time per
uncached prompt token only.

Policies, each a gateway of its own on the same servers, taking turns round by round, each
run on emptied caches with conversations of its own:

* `least_outstanding`: requests in flight only (the gateway's choice before selection
  learned anything else);
* `random`: a uniformly random healthy server;
* `session`: the default composition without prefix affinity, each conversation naming
  itself in `x-session-id`;
* `prefix`: the default composition (prefix affinity from the blocks sent);
* `prefix_weight_1`: the same with the `prefix` scorer's weight 1 (the default is 2);
* `prefix_kv_events`: the same, knowing what each server holds from its KV-cache events;
* `oracle`: not a run but a bound: the hit rate of sending every turn where the previous
  one was computed, with no eviction (a turn's answer is decoded elsewhere, so the
  previous prompt is the most any prefill server can hold).

Then the `prefix` policy once more with one prefill server killed (SIGKILL) a third of the
way in: the client errors, and TTFT p99 of the turns sent `recovery_s` after the kill
against the healthy run's and against a healthy run on the servers that remain (the same
workload, a gateway that never knew the last server): losing a quarter of the servers
costs capacity whatever the gateway does, and the second comparison says whether the
gateway made the best of what was left.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import signal
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvloop

from bench.experiments.harness import (
    BenchGateway,
    latency_model,
    node_entries,
    share_of,
    started_together,
)
from bench.processes import stop_all
from bench.stats import percentile
from sim.stack import NodeInfo, SimStack

MODEL = "agents"
BLOCK_SIZE = 16
ANSWER_TOKENS = 32
SESSION_HEADER = "x-session-id"
KV_EVENTS = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:*"}
WORDS = (
    "apple river stone cloud tiger paper window garden silver rocket orange forest bridge "
    "candle engine harbor island jacket kettle ladder marble needle ocean pencil quartz "
    "rabbit saddle tunnel umbrella valley wagon yellow zebra anchor basket castle dragon "
    "feather glacier hammer"
).split()


@dataclass(frozen=True, slots=True)
class Policy:
    selection: dict[str, Any]
    session: bool = False


POLICIES = {
    "least_outstanding": Policy({"prefix_affinity": False, "weights": {"queue": 0, "session": 0}}),
    "random": Policy(
        {"prefix_affinity": False, "weights": {"load": 0, "queue": 0, "session": 0, "random": 1}}
    ),
    "session": Policy({"prefix_affinity": False}, session=True),
    "prefix": Policy({}),
    "prefix_weight_1": Policy({"weights": {"prefix": 1}}),
    "prefix_kv_events": Policy({"prefix_index": "kv_events"}),
}
BASELINE = "least_outstanding"


@dataclass(frozen=True, slots=True)
class AgentOptions:
    conversations: int = 32
    turns: int = 10
    first_words: int = 2000
    turn_words: int = 3100
    prefills: int = 4
    prefill_ms_per_token: float = 0.1
    """10k uncached tokens a second: the order of one 8-GPU node's prefill of a large model
    at these context lengths. Far below it, the servers idle and the simulators' and the
    gateway's own CPU time (which grows with the whole prompt) dominates TTFT."""
    cache_blocks: int = 65536
    """Each server's prefix cache, in blocks: a million tokens, room for every
    conversation's context."""
    think_ms: float = 2000.0
    """Mean pause between a turn's answer and the next turn (exponential): an agent's tool
    calls, a person reading."""
    rounds: int = 1
    kill: bool = True
    recovery_s: float = 10.0

    @classmethod
    def quick(cls) -> AgentOptions:
        return cls(
            conversations=4, turns=3, first_words=200, turn_words=300, think_ms=50, recovery_s=0.5
        )

    @property
    def prefill_args(self) -> list[str]:
        return [
            "--enable-prefix-caching",
            "--serial-prefill",
            "--block-size",
            str(BLOCK_SIZE),
            "--num-gpu-blocks",
            str(self.cache_blocks),
            "--kv-events-config",
            orjson.dumps(KV_EVENTS).decode(),
            "--prefill-ms-per-token",
            str(self.prefill_ms_per_token),
            "--itl-ms",
            "0",
        ]


@dataclass(slots=True)
class Turn:
    sent_at: float
    ttft_s: float = math.nan
    prompt_tokens: int = 0
    cached_tokens: int = 0
    bound_tokens: int = 0  # the previous turn's prompt, in whole blocks
    server: str = ""
    reason: str = ""
    error: str | None = None


@dataclass(slots=True)
class Outcome:
    turns: list[Turn] = field(default_factory=list)
    in_flight: Counter[str] = field(default_factory=Counter)  # summed over the samples
    samples: int = 0

    @property
    def answered(self) -> list[Turn]:
        return [t for t in self.turns if t.error is None]

    def ttft_ms(self, since: float = -math.inf) -> list[float]:
        return [t.ttft_s * 1e3 for t in self.answered if t.sent_at >= since]

    def hit_rate(self, bound: bool = False) -> float:
        prompt = sum(t.prompt_tokens for t in self.answered)
        cached = sum(t.bound_tokens if bound else t.cached_tokens for t in self.answered)
        return cached / prompt if prompt else math.nan

    def imbalance(self, urls: list[str]) -> float:
        """The busiest server's mean requests in flight over the mean of all servers'."""
        means = [self.in_flight[url] / max(self.samples, 1) for url in urls]
        average = statistics.fmean(means)
        return max(means) / average if average else math.nan

    @property
    def errors(self) -> Counter[str]:
        return Counter(t.error for t in self.turns if t.error is not None)


REMAINING = "prefix_remaining"
"""The healthy run on every server but the one the killed run loses."""


def gateway_config(
    prefills: SimStack, nodes: list[NodeInfo], policy: Policy, *, servers: int | None = None
) -> dict[str, Any]:
    """A gateway with `policy` on the first `servers` prefill servers (all: None), and
    `nodes`."""
    used = prefills.prefills[:servers]
    selection = {
        "block_size": BLOCK_SIZE,
        "kv_events": {"endpoints": {p.url: p.kv_events_endpoint for p in used}},
        **policy.selection,
    }
    model = latency_model(prefills, MODEL, selection=selection)
    model["latency"]["prefill"] = [p.url for p in used]
    model["latency"]["nodes"] = node_entries(nodes)
    return {
        "server": {"expose_upstream": True},
        "logging": {"access_log": False},
        "upstreams": {"probe_interval_s": 1},
        "gate": {"max_queue": 1000, "max_queue_wait_ms": 120_000},
        "classification": {
            "rules": {"default": {"name": "all", "path": "latency", "on_saturation": "queue"}}
        },
        "models": [model],
    }


def gateways_of(names: list[str], *, remaining: bool) -> list[str]:
    """The gateways a run starts: one per policy, and with `remaining`, `REMAINING`."""
    return [*names, REMAINING] if remaining else list(names)


@contextmanager
def policy_gateways(
    prefills: SimStack, nodes: SimStack, names: list[str], *, remaining: bool
) -> Iterator[dict[str, str]]:
    """The base URL of one ready gateway per policy (and with `remaining`, one of `prefix`
    without the last server, as `REMAINING`); stopped on the way out.

    They start together, each with nodes of its own (an equal share of `nodes`): a gateway
    flushes every node of its pool as it starts, which takes a node a second, and gateways
    sharing nodes would wait on each other's flushes."""
    labels = gateways_of(names, remaining=remaining)
    own = {label: share_of(nodes.nodes, i, len(labels)) for i, label in enumerate(labels)}
    configs = {name: gateway_config(prefills, own[name], POLICIES[name]) for name in names}
    if remaining:
        without_last = len(prefills.prefills) - 1
        configs[REMAINING] = gateway_config(
            prefills, own[REMAINING], POLICIES["prefix"], servers=without_last
        )
    with tempfile.TemporaryDirectory(prefix="pd-gateway-agents-") as workdir:
        gateways: dict[str, BenchGateway] = {}
        try:
            for name, config in configs.items():
                gateways[name] = BenchGateway(config, Path(workdir) / name)
            yield {name: gateway.wait_ready() for name, gateway in gateways.items()}
        finally:
            stop_all(gateways.values())


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def turn(
    client: httpx.AsyncClient,
    base_url: str,
    messages: list[dict[str, str]],
    headers: dict[str, str],
) -> tuple[Turn, str]:
    """One streamed turn and its answer's text."""
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": ANSWER_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    result = Turn(sent_at=time.perf_counter())
    parts: list[str] = []
    try:
        async with client.stream(
            "POST", base_url + "/chat/completions", json=body, headers=headers
        ) as response:
            if response.status_code != 200:
                error = orjson.loads(await response.aread()).get("error") or {}
                result.error = f"{response.status_code} {error.get('code') or error.get('type')}"
                return result, ""
            upstream = response.headers.get("x-pd-upstream", "")
            result.server, _, why = upstream.partition("; reason=")
            result.reason = why.split(":")[0]
            usage: dict[str, Any] | None = None
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                event = orjson.loads(line[6:])
                if "error" in event:
                    result.error = f"stream {event['error'].get('code')}"
                for choice in event.get("choices") or ():
                    content = choice.get("delta", {}).get("content")
                    if content:
                        if math.isnan(result.ttft_s):
                            result.ttft_s = time.perf_counter() - result.sent_at
                        parts.append(content)
                usage = event.get("usage") or usage
    except httpx.HTTPError as exc:
        result.error = f"transport {type(exc).__name__}"
        return result, ""
    if result.error is None and (math.isnan(result.ttft_s) or usage is None):
        result.error = "stream without text or usage"
    if usage is not None:
        result.prompt_tokens = usage["prompt_tokens"]
        details = usage.get("prompt_tokens_details") or {}
        result.cached_tokens = details.get("cached_tokens") or 0
    return result, "".join(parts)


async def conversation(
    client: httpx.AsyncClient,
    base_url: str,
    seed: str,
    options: AgentOptions,
    outcome: Outcome,
    session: bool,
    answered: Callable[[], None] = lambda: None,
) -> None:
    """One conversation's turns into `outcome`, `answered` called after each."""
    rng = random.Random(seed)
    headers = {SESSION_HEADER: seed} if session else {}
    messages = [{"role": "user", "content": text(rng, options.first_words)}]
    previous_prompt = 0
    for index in range(options.turns):
        if index:
            messages.append({"role": "user", "content": text(rng, options.turn_words)})
        result, answer = await turn(client, base_url, messages, headers)
        result.bound_tokens = previous_prompt // BLOCK_SIZE * BLOCK_SIZE
        previous_prompt = result.prompt_tokens
        outcome.turns.append(result)
        answered()
        if result.error is not None:
            return  # a conversation whose turn failed ends there, as an agent's would
        messages.append({"role": "assistant", "content": answer})
        await asyncio.sleep(rng.expovariate(1000 / options.think_ms) if options.think_ms else 0)


async def sample_in_flight(client: httpx.AsyncClient, base_url: str, outcome: Outcome) -> None:
    """Every 50 ms, each prefill server's requests in flight as the gateway counts them."""
    admin = base_url.removesuffix("/v1") + "/admin/upstreams"
    while True:
        sets = (await client.get(admin)).json()["models"][MODEL]
        for servers in sets.values():
            for url, state in servers.items():
                outcome.in_flight[url] += state["outstanding"]
        outcome.samples += 1
        await asyncio.sleep(0.05)


async def workload(
    base_url: str,
    stack: SimStack,
    seed: str,
    options: AgentOptions,
    outcome: Outcome,
    session: bool = False,
    kill_after_s: float | None = None,
    dead: int = 0,
) -> float | None:
    """Every conversation once, the last prefill server killed a third of the way in if
    `kill_after_s` is given (`kill_later`; the last `dead` are already); returns when it
    was killed (perf_counter)."""
    limits = httpx.Limits(max_connections=options.conversations + 8)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        for server in stack.prefills[: len(stack.prefills) - dead]:  # empty caches
            (await client.post(server.url + "/sim/reset")).raise_for_status()
        sampler = asyncio.create_task(sample_in_flight(client, base_url, outcome))
        killed: list[float] = []
        killer = None
        a_third_in = asyncio.Event()

        def answered() -> None:
            if len(outcome.turns) * 3 >= options.conversations * options.turns:
                a_third_in.set()

        if kill_after_s is not None:
            killer = asyncio.create_task(kill_later(stack, kill_after_s, a_third_in, killed))
        try:
            await asyncio.gather(
                *(
                    conversation(
                        client, base_url, f"{seed}/{c}", options, outcome, session, answered
                    )
                    for c in range(options.conversations)
                )
            )
        finally:
            sampler.cancel()
            if killer is not None:
                killer.cancel()
    return killed[0] if killed else None


async def kill_later(
    stack: SimStack, after_s: float, a_third_in: asyncio.Event, killed: list[float]
) -> None:
    """Kill the last prefill server a third of the way in: after `after_s` (a third of the
    healthy run's time), or once a third of the run's turns are answered (`a_third_in`),
    whichever comes first: a run of a few short turns may go faster than the healthy one
    did, and end before its time is up."""
    try:
        await asyncio.wait_for(a_third_in.wait(), after_s)
    except TimeoutError:
        pass
    os.kill(stack.prefills[-1].pid, signal.SIGKILL)
    killed.append(time.perf_counter())


async def warm_up(base_url: str) -> None:
    async with httpx.AsyncClient(timeout=120) as client:
        result, _ = await turn(client, base_url, [{"role": "user", "content": "warm up"}], {})
        if result.error:
            raise SystemExit(f"the gateway at {base_url} does not answer: {result.error}")


@dataclass(slots=True)
class Results:
    options: AgentOptions
    urls: list[str]
    outcomes: dict[str, Outcome]
    healthy_s: float = math.nan  # how long the last healthy prefix run took
    remaining: Outcome | None = None  # `prefix` on every server but the last
    killed: Outcome | None = None
    killed_at: float | None = None


def measure(options: AgentOptions) -> Results:
    names = list(POLICIES)
    outcomes = {name: Outcome() for name in names}
    stack = SimStack(
        nodes=0,
        prefills=options.prefills,
        model=MODEL,
        prefill_args=options.prefill_args,
    )
    nodes = SimStack(  # one per conversation for each gateway
        nodes=options.conversations * len(gateways_of(names, remaining=options.kill)),
        prefills=0,
        model=MODEL,
        node_args=["--step-ms", "2", "--tokens-per-step", "4"],
        one_process=True,
    )
    with started_together([stack, nodes]):
        results = Results(options, [p.url for p in stack.prefills], outcomes)
        with policy_gateways(stack, nodes, names, remaining=options.kill) as base_urls:
            for base_url in base_urls.values():
                uvloop.run(warm_up(base_url))
            for round_index in range(options.rounds):
                shift = round_index % len(names)
                for name in names[shift:] + names[:shift]:
                    started = time.perf_counter()
                    seed = f"{name}/{round_index}"
                    session = POLICIES[name].session
                    uvloop.run(
                        workload(base_urls[name], stack, seed, options, outcomes[name], session)
                    )
                    if name == "prefix":
                        results.healthy_s = time.perf_counter() - started
            if options.kill:
                # The same conversations on the servers that will remain, then on all of
                # them with the last one killed.
                seed = "prefix/killed"
                results.remaining = Outcome()
                uvloop.run(workload(base_urls[REMAINING], stack, seed, options, results.remaining))
                results.killed = Outcome()
                results.killed_at = uvloop.run(
                    workload(
                        base_urls["prefix"],
                        stack,
                        seed,
                        options,
                        results.killed,
                        kill_after_s=results.healthy_s / 3,
                    )
                )
    return results


TARGET_P50_RATIO = 0.5
TARGET_HIT_SHARE = 0.9
TARGET_IMBALANCE = 1.5
TARGET_RECOVERED_P99 = 1.1


def _ms(values: list[float], q: float | None) -> float:
    if not values:
        return math.nan
    return statistics.fmean(values) if q is None else percentile(values, q)


def report(results: Results, command: str) -> str:
    """The run as Markdown: one column per policy, each figure beside its ratio to
    least-outstanding's, then the killed run and the targets."""
    o = results.options
    outcomes = results.outcomes
    base = outcomes[BASELINE]
    last = o.first_words + (o.turns - 1) * o.turn_words
    lines = [
        f"`{command}`: {o.conversations} conversations x {o.turns} turns (~{o.first_words} to"
        f" ~{last} words of context, {o.think_ms:g} ms mean think time), {o.rounds} round(s);"
        f" {o.prefills} prefill servers (`{' '.join(o.prefill_args)}`)",
        "",
        "| measure | " + " | ".join(outcomes) + " | oracle |",
        "| --- |" + " --- |" * (len(outcomes) + 1),
    ]

    def row(name: str, figure: Any, fmt: str, oracle: str = "") -> None:
        cells = []
        for outcome in outcomes.values():
            value, reference = figure(outcome), figure(base)
            ratio = f" ({value / reference:.2f})" if outcome is not base and reference else ""
            cells.append(f"{value:{fmt}}{ratio}")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {oracle} |")

    row("turns answered", lambda x: len(x.answered), "d")
    row("TTFT p50 (ms)", lambda x: _ms(x.ttft_ms(), 0.5), ".1f")
    row("TTFT p99 (ms)", lambda x: _ms(x.ttft_ms(), 0.99), ".1f")
    row("TTFT mean (ms)", lambda x: _ms(x.ttft_ms(), None), ".1f")
    bound = statistics.fmean(x.hit_rate(bound=True) for x in outcomes.values())
    row("prefix hit rate", lambda x: x.hit_rate(), ".3f", f"{bound:.3f}")
    row("load imbalance (max/mean in flight)", lambda x: x.imbalance(results.urls), ".2f")
    lines.append("")
    for name, outcome in outcomes.items():
        reasons = Counter(t.reason for t in outcome.answered)
        listed = ", ".join(f"{k} x{v}" for k, v in sorted(reasons.items()))
        errors = ", ".join(f"{k} x{v}" for k, v in sorted(outcome.errors.items())) or "none"
        lines.append(f"* `{name}`: reasons {listed}; client errors: {errors}")
    lines += ["", *_killed_lines(results), "", *_target_lines(results, bound)]
    return "\n".join(lines) + "\n"


def _killed_lines(results: Results) -> list[str]:
    killed, at = results.killed, results.killed_at
    if killed is None:
        return ["(no run with a server killed)"]
    if at is None:
        return ["The run with a server killed ended before the kill: make the run longer."]
    errors = ", ".join(f"{k} x{v}" for k, v in sorted(killed.errors.items())) or "none"
    after = killed.ttft_ms(since=at + results.options.recovery_s)
    healthy = results.outcomes["prefix"].ttft_ms()
    lines = [
        f"`prefix` with prefill server {len(results.urls) - 1} killed"
        f" {at - _start(killed):.1f} s in: {len(killed.answered)} turns answered; client"
        f" errors: {errors}; TTFT p99 of the {len(after)} turns sent"
        f" {results.options.recovery_s:g} s or more after the kill: {_ms(after, 0.99):.1f} ms"
        f" against {_ms(healthy, 0.99):.1f} ms healthy on {len(results.urls)} servers",
    ]
    if (remaining := _remaining_after(results)) is not None:
        lines[0] += (
            f" and {_ms(remaining, 0.99):.1f} ms for the same conversations' turns sent as"
            f" late, healthy on the {len(results.urls) - 1} servers that remain"
        )
    return lines


def _start(outcome: Outcome) -> float:
    return min(t.sent_at for t in outcome.turns)


def _remaining_after(results: Results) -> list[float] | None:
    """TTFT (ms) of the healthy run on the remaining servers, of the turns sent as long
    after its start as the killed run's turns counted after its kill."""
    killed, at, remaining = results.killed, results.killed_at, results.remaining
    if killed is None or at is None or remaining is None or not remaining.turns:
        return None
    offset = at + results.options.recovery_s - _start(killed)
    return remaining.ttft_ms(since=_start(remaining) + offset)


def _target_lines(results: Results, bound: float) -> list[str]:
    outcomes = results.outcomes
    prefix, base = outcomes["prefix"], outcomes[BASELINE]
    p50 = _ms(prefix.ttft_ms(), 0.5) / _ms(base.ttft_ms(), 0.5)
    hits = prefix.hit_rate() / bound
    imbalance = prefix.imbalance(results.urls)
    checks = [
        (f"prefix TTFT p50 / least_outstanding's ≤ {TARGET_P50_RATIO}", p50, p50 <= 0.5),
        (f"prefix hit rate / oracle's ≥ {TARGET_HIT_SHARE}", hits, hits >= TARGET_HIT_SHARE),
        (f"prefix load imbalance ≤ {TARGET_IMBALANCE}", imbalance, imbalance <= 1.5),
    ]
    killed, at = results.killed, results.killed_at
    if killed is not None and at is not None:
        never_sent = sum(n for code, n in killed.errors.items() if "unreachable" in code)
        after = _ms(killed.ttft_ms(since=at + results.options.recovery_s), 0.99)
        recovered = after / _ms(prefix.ttft_ms(), 0.99)
        late = f"killed server: TTFT p99 after {results.options.recovery_s:g} s"
        checks += [
            ("killed server: client errors for never-sent turns = 0", never_sent, never_sent == 0),
            (
                f"{late} / healthy on all servers ≤ {TARGET_RECOVERED_P99}",
                recovered,
                recovered <= TARGET_RECOVERED_P99,
            ),
        ]
        if (remaining := _remaining_after(results)) is not None:
            against = after / _ms(remaining, 0.99)
            checks.append(
                (
                    f"{late} / healthy on the servers that remain ≤ {TARGET_RECOVERED_P99}",
                    against,
                    against <= TARGET_RECOVERED_P99,
                )
            )
    return ["| target | measured | met |", "| --- | --- | --- |"] + [
        f"| {name} | {value:.2f} | {'yes' if met else 'no'} |" for name, value, met in checks
    ]


def run_agents(args: Any, command: str) -> int:
    """`pd-gateway bench --scenario agents`: measure, print the table, write it to the
    output directory and, with `--report`, into that page."""
    from dataclasses import replace

    from bench.report import publish

    options = AgentOptions.quick() if args.quick else AgentOptions()
    given = {"conversations": args.conversations, "turns": args.turns, "rounds": args.rounds}
    options = replace(options, **{k: v for k, v in given.items() if v is not None})
    publish(report(measure(options), command), "agents", Path(args.out), args.report)
    return 0
