"""How much time to first token does prefix affinity save for multi-turn conversations,
against least-outstanding alone?

A multi-turn agent workload: N conversations of T turns, each turn sending the whole
conversation so far (its earlier user messages and answers) plus a new user message, so the
context grows from about `--first-tokens` to `--first-tokens + (T - 1) * --turn-tokens`
tokens. The conversations run concurrently, each one turn after another, as streamed
requests on the latency path of a gateway in front of 4 simulated vLLM prefill servers with
a prefix cache (`--enable-prefix-caching`, 16-token blocks) whose prefill time is
dominated by uncached tokens (0.05 ms per uncached token, none per cached one).

Two gateways run on the same servers, one with each selection setting; three policies:

* `baseline`: `selection.prefix_affinity: false` (health, least outstanding, the servers'
  own load);
* `affinity`: the default composition (the same, plus prefix affinity);
* `session`: the default composition, and each conversation names itself in
  `x-session-id` (its fallback when the prompt's prefix is nowhere, or was not encoded).

A random choice cannot be configured, so it is not measured. The policies take turns: each
round runs the whole workload once per policy (in rotating order), with every prefill
server's cache emptied first and conversations of their own, so that none inherits
another's cache and noise falls on none alone. Reported per policy and as its ratio to
`baseline`: TTFT mean, p50 and p99 (from sending the request to the first content event),
the prefix hit rate (cached_tokens / prompt_tokens summed over the answers' usage; the best a
policy can reach is the share of each prompt its previous turn sent), each server's share
of the requests and the gateway's reasons for its choices (`x-pd-upstream`).

Run: `python -m bench.experiments.prefix_affinity [--conversations N] [--turns T]
[--rounds R] [--first-tokens K] [--turn-tokens K]`.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
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

from bench.experiments.harness import BenchGateway
from sim.stack import SimStack

MODEL = "ds"
PREFILLS = 4
BLOCK_SIZE = 16
PREFILL_ARGS = [
    "--enable-prefix-caching",
    "--block-size",
    str(BLOCK_SIZE),
    "--prefill-ms-per-token",
    "0.2",
    "--cached-prefill-ms-per-token",
    "0",
    "--itl-ms",
    "0",
]
NODE_ARGS = ["--step-ms", "2", "--tokens-per-step", "4"]
ANSWER_TOKENS = 32
POLICIES = {"baseline": (False, False), "affinity": (True, False), "session": (True, True)}
"""name: (prefix affinity, a session header per conversation)"""
WORDS = (
    "apple river stone cloud tiger paper window garden silver rocket orange forest bridge "
    "candle engine harbor island jacket kettle ladder marble needle ocean pencil quartz "
    "rabbit saddle tunnel umbrella valley wagon yellow zebra anchor basket castle dragon "
    "feather glacier hammer"
).split()


@dataclass(slots=True)
class Outcome:
    ttft_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    servers: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)

    @property
    def requests(self) -> int:
        return len(self.ttft_s)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else math.nan


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def model_entry(prefills: SimStack, nodes: SimStack, affinity: bool) -> dict[str, Any]:
    return {
        "name": MODEL,
        "tokenizer": "deepseek",
        "latency": {
            "prefill": [p.url for p in prefills.prefills],
            "nodes": [
                {"host": n.host, "ctrl_port": n.ctrl_port, "http_port": n.http_port}
                for n in nodes.nodes
            ],
        },
        "selection": {"prefix_affinity": affinity, "block_size": BLOCK_SIZE},
    }


def gateway_config(prefills: SimStack, nodes: SimStack, affinity: bool) -> dict[str, Any]:
    return {
        "server": {"expose_upstream": True},
        "logging": {"access_log": False},
        "gate": {"max_queue": 1000, "max_queue_wait_ms": 120_000},
        "classification": {
            "rules": {"default": {"name": "all", "path": "latency", "on_saturation": "queue"}}
        },
        "models": [model_entry(prefills, nodes, affinity)],
    }


@contextmanager
def policy_gateways(configs: dict[str, dict[str, Any]]) -> Iterator[dict[str, BenchGateway]]:
    """One installed gateway per policy, each with its own config; stopped on the way out."""
    with tempfile.TemporaryDirectory(prefix="pd-gateway-bench-") as workdir:
        gateways: dict[str, BenchGateway] = {}
        try:
            for policy, config in configs.items():
                gateways[policy] = BenchGateway(config, Path(workdir) / policy)
            yield gateways
        finally:
            for gateway in gateways.values():
                gateway.stop()


async def turn(
    client: httpx.AsyncClient,
    base_url: str,
    messages: list[dict[str, str]],
    outcome: Outcome,
    headers: dict[str, str] | None = None,
) -> str:
    """One streamed turn: notes its TTFT, usage and server; returns the answer's text."""
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": ANSWER_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    ttft = math.nan
    parts: list[str] = []
    usage: dict[str, Any] | None = None
    async with client.stream(
        "POST", base_url + "/chat/completions", json=body, headers=headers
    ) as response:
        if response.status_code != 200 or response.headers.get("x-pd-route") != "latency":
            raise SystemExit(
                f"unexpected answer {response.status_code}: {await response.aread()!r}"
            )
        url, _, why = response.headers["x-pd-upstream"].partition("; reason=")
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = orjson.loads(line[6:])
            for choice in event.get("choices") or ():
                content = choice.get("delta", {}).get("content")
                if content:
                    if math.isnan(ttft):
                        ttft = time.perf_counter() - sent
                    parts.append(content)
            usage = event.get("usage") or usage
    if math.isnan(ttft) or usage is None:
        raise SystemExit("a stream without text or usage")
    details = usage.get("prompt_tokens_details") or {}
    outcome.ttft_s.append(ttft)
    outcome.prompt_tokens += usage["prompt_tokens"]
    outcome.cached_tokens += details.get("cached_tokens") or 0
    outcome.servers[url] += 1
    outcome.reasons[why.split(":")[0]] += 1
    return "".join(parts)


async def conversation(
    client: httpx.AsyncClient,
    base_url: str,
    seed: str,
    args: argparse.Namespace,
    outcome: Outcome,
    session: bool,
) -> None:
    rng = random.Random(seed)
    headers = {"x-session-id": seed} if session else None
    messages = [{"role": "user", "content": text(rng, args.first_tokens)}]
    for index in range(args.turns):
        if index:
            messages.append({"role": "user", "content": text(rng, args.turn_tokens)})
        answer = await turn(client, base_url, messages, outcome, headers)
        messages.append({"role": "assistant", "content": answer})


async def workload(
    base_url: str,
    prefill_urls: list[str],
    seed: str,
    args: argparse.Namespace,
    outcome: Outcome,
    session: bool,
) -> None:
    limits = httpx.Limits(max_connections=args.conversations + 8)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        for url in prefill_urls:  # an empty prefix cache for every policy's run
            (await client.post(url + "/sim/reset")).raise_for_status()
        await asyncio.gather(
            *(
                conversation(client, base_url, f"{seed}/{c}", args, outcome, session)
                for c in range(args.conversations)
            )
        )


async def warm_up(base_url: str) -> None:
    async with httpx.AsyncClient(timeout=120) as client:
        messages = [{"role": "user", "content": "warm up"}]
        await turn(client, base_url, messages, Outcome())


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1e3


def measure(args: argparse.Namespace) -> tuple[dict[str, Outcome], list[str]]:
    """Every policy's outcome over all rounds, and the prefill servers' URLs."""
    outcomes = {policy: Outcome() for policy in POLICIES}
    with (
        SimStack(nodes=0, prefills=PREFILLS, model=MODEL, prefill_args=PREFILL_ARGS) as prefills,
        SimStack(
            nodes=args.conversations,
            prefills=0,
            model=MODEL,
            node_args=NODE_ARGS,
            one_process=True,
        ) as nodes,
    ):
        urls = [p.url for p in prefills.prefills]
        configs = {f"prefix={on}": gateway_config(prefills, nodes, on) for on in (True, False)}
        with policy_gateways(configs) as gateways:
            base_urls = {name: gateway.wait_ready() for name, gateway in gateways.items()}
            for base_url in base_urls.values():  # loads the tokenizer and chat template
                uvloop.run(warm_up(base_url))
            order = list(POLICIES)
            for round_index in range(args.rounds):
                shift = round_index % len(order)
                for policy in order[shift:] + order[:shift]:
                    prefix, session = POLICIES[policy]
                    base_url = base_urls[f"prefix={prefix}"]
                    seed = f"{policy}/{round_index}"
                    uvloop.run(workload(base_url, urls, seed, args, outcomes[policy], session))
    return outcomes, urls


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def share_of(url: str) -> Callable[[Outcome], float]:
    return lambda outcome: outcome.servers[url] / outcome.requests


def report(outcomes: dict[str, Outcome], urls: list[str], args: argparse.Namespace) -> str:
    baseline = outcomes["baseline"]
    others = [policy for policy in outcomes if policy != "baseline"]
    last = args.first_tokens + (args.turns - 1) * args.turn_tokens
    lines = [
        f"{args.conversations} conversations x {args.turns} turns (~{args.first_tokens} to "
        f"~{last} words of context), {args.rounds} round(s); {PREFILLS} prefill servers "
        f"({' '.join(PREFILL_ARGS)})",
        f"{'':<24}{'baseline':>10}" + "".join(f"{p:>10}{'/ base':>8}" for p in others),
    ]

    def row(name: str, measure: Callable[[Outcome], float], fmt: str) -> None:
        base = measure(baseline)
        cells = "".join(
            f"{measure(outcomes[p]):>10{fmt}}{ratio(measure(outcomes[p]), base):>8}" for p in others
        )
        lines.append(f"{name:<24}{base:>10{fmt}}{cells}")

    row("requests", lambda o: o.requests, "d")
    row("TTFT mean (ms)", lambda o: statistics.fmean(o.ttft_s) * 1e3, ".1f")
    row("TTFT p50 (ms)", lambda o: pct(o.ttft_s, 0.5), ".1f")
    row("TTFT p99 (ms)", lambda o: pct(o.ttft_s, 0.99), ".1f")
    row("prefix hit rate", lambda o: o.hit_rate, ".3f")
    for index, url in enumerate(urls):
        row(f"share of prefill-{index}", share_of(url), ".3f")
    for policy, outcome in outcomes.items():
        reasons = ", ".join(f"{k} x{v}" for k, v in sorted(outcome.reasons.items()))
        lines.append(f"{policy} reasons: {reasons}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    result.add_argument("--conversations", type=int, default=16)
    result.add_argument("--turns", type=int, default=6)
    result.add_argument("--rounds", type=int, default=2)
    result.add_argument("--first-tokens", type=int, default=1000, help="words of the first turn")
    result.add_argument("--turn-tokens", type=int, default=1400, help="words each turn adds")
    return result


def main() -> None:
    args = parser().parse_args()
    outcomes, urls = measure(args)
    print(report(outcomes, urls, args))


if __name__ == "__main__":
    main()
