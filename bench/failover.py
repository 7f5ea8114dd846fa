"""`pd-gateway bench --scenario failover`: what a decode failing mid-answer costs a client
whose answer is continued elsewhere.

16 streams at a time on 4 simulated TileRT nodes, each client asking for its own greedy
answer again and again, while one node after another, one at a time, is made to break its
next decode a few tokens in: `died` (its stream cut) in one round, `stalled` (silent, given
up after `timeouts.decode_stall_s`) in another; on a TileRT 0.1.5 pool and a 0.1.6 pool.
Then the same load on the native path in `pull` mode, 4 simulated vLLM decode servers, one
after another made to drop its next stream (`died`). What it reports, per pool and round:

* answers whole: every answer's text against the same client's uninterrupted answer
  (greedy), and how many were continued (the gateway's `pd_gateway_continuations_total`);
* the gap at the seam: the longest waits between two pieces of an answer's text, one per
  continuation, p50 and p99, beside the prefill time of the continuations themselves (the
  prefill server's own record of each prefill that named the prompt and the output so far
  as token ids; on the native path, the decode server's time to the continuation's first
  token) and TTFT of the uninterrupted answers. The target: a `died` seam's p50 within one
  continuation prefill plus 50 ms.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvloop
from prometheus_client.parser import text_string_to_metric_families

from bench.experiments.harness import BenchGateway, latency_model, started_together
from bench.processes import stop_all
from bench.stats import percentile
from sim.stack import SimStack

MODEL = "failover"
POOLS = ("TileRT 0.1.5", "TileRT 0.1.6", "vLLM pull")
NATIVE = "vLLM pull"
FAULTS = {"died": "die_after", "stalled": "stall_after"}
NATIVE_FAULTS = ("died",)  # a simulated vLLM server has no fault that stalls mid-stream
STALL_S = 1.0
TARGET_SEAM_OVER_PREFILL_MS = 50.0


@dataclass(frozen=True, slots=True)
class FailoverOptions:
    clients: int = 16
    nodes: int = 4
    answers_each: int = 6
    answer_words: int = 60
    chaos_every_s: float = 0.25
    prefill_ms_per_token: float = 0.2
    """A continuation's prefill grows with the answer so far: at 5k tokens a second, its
    cost shows beside the gateway's own."""
    step_ms: float = 4.0
    reference_streams: int = 1
    """The uninterrupted answers before each round (the reference, and TTFT) sent this many
    at a time: one, or up to one per node, so that none waits for a node."""
    one_process: bool = False
    """Each pool's simulators served by one process (`SimStack(one_process=True)`): quicker
    to start, their CPU shared."""

    @classmethod
    def quick(cls) -> FailoverOptions:
        return cls(
            clients=8, answers_each=2, answer_words=30, reference_streams=4, one_process=True
        )


@dataclass(slots=True)
class Round:
    pool: str
    fault: str
    answers: int = 0
    whole: int = 0
    continued: int = 0
    failed: list[str] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)  # every wait between two text pieces
    ttft_s: list[float] = field(default_factory=list)  # the uninterrupted answers'
    prefill_s: list[float] = field(default_factory=list)  # the continuations' prefills
    reasons: Counter[str] = field(default_factory=Counter)  # the continuations' `reason`s

    @property
    def seams_s(self) -> list[float]:
        """The longest waits, one per continuation: where the answers went on elsewhere."""
        return sorted(self.gaps_s, reverse=True)[: self.continued]


def answer_text(client: int, words: int) -> str:
    return " ".join(f"c{client}w{i}" for i in range(words)) + " done."


async def stream(
    http: httpx.AsyncClient, base_url: str, text: str
) -> tuple[str, list[float], float]:
    """One streamed answer: its text, the waits between its pieces, and its TTFT."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"[[sim-output]]{text}[[/sim-output]]"}],
        "stream": True,
    }
    sent = time.perf_counter()
    times: list[float] = []
    parts: list[str] = []
    async with http.stream("POST", base_url + "/chat/completions", json=body) as response:
        if response.status_code != 200:
            error = orjson.loads(await response.aread()).get("error") or {}
            raise RuntimeError(f"answered {response.status_code} {error.get('code')}")
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = orjson.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"stream error {event['error'].get('code')}")
            for choice in event.get("choices") or ():
                if content := choice.get("delta", {}).get("content"):
                    times.append(time.perf_counter())
                    parts.append(content)
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    return "".join(parts), gaps, (times[0] - sent) if times else float("nan")


def decoders(stack: SimStack, pool: str) -> list[str]:
    """Where the pool's decodes run: its nodes, or on the native path its decode servers."""
    return [s.url for s in (stack.decodes if pool == NATIVE else stack.nodes)]


async def chaos(decoding: list[str], fault: str, every_s: float, done: asyncio.Event) -> None:
    """Every `every_s`, unless a fault is still waiting on some server, one decoding server
    is made to break its next decode a few tokens in: one failing at a time."""
    rng = random.Random(fault)
    async with httpx.AsyncClient(timeout=10) as http:
        while True:
            try:
                await asyncio.wait_for(done.wait(), every_s)
                return
            except TimeoutError:
                pass
            waiting = [(await http.get(url + "/sim/faults")).json()["faults"] for url in decoding]
            if not any(waiting):
                url = rng.choice(decoding)
                arm = {FAULTS[fault]: rng.randint(2, 40), "count": 1}
                await http.post(url + "/sim/faults", json=arm)


async def one_round(
    base_url: str, metrics_url: str, stack: SimStack, options: FailoverOptions, result: Round
) -> None:
    texts = [answer_text(i, options.answer_words) for i in range(options.clients)]
    limits = httpx.Limits(max_connections=options.clients * 2)
    native = result.pool == NATIVE
    decoding = decoders(stack, result.pool)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        if not native:
            await every_node_in_service(http, base_url)
        references = asyncio.Semaphore(options.reference_streams)

        async def reference(text: str) -> None:  # uninterrupted: the reference, and TTFT
            async with references:
                got, _, ttft = await stream(http, base_url, text)
            if got != text:
                raise RuntimeError("an uninterrupted answer is not its script")
            result.ttft_s.append(ttft)

        await asyncio.gather(*(reference(text) for text in texts))
        before = await continued(http, metrics_url)
        prefilling = decoding if native else [stack.prefills[0].url]
        for url in prefilling:
            await http.post(url + "/sim/reset")
        done = asyncio.Event()
        # Decode servers run every stream at once, nodes one each: a native round is over
        # about `nodes` times sooner, and breaks as many streams with its chaos that much
        # more often.
        every_s = options.chaos_every_s / (options.nodes if native else 1)
        breaking = asyncio.create_task(chaos(decoding, result.fault, every_s, done))

        async def client(text: str) -> None:
            for _ in range(options.answers_each):
                result.answers += 1
                try:
                    got, gaps, _ = await stream(http, base_url, text)
                except (RuntimeError, httpx.HTTPError) as exc:
                    result.failed.append(str(exc))
                    continue
                result.gaps_s.extend(gaps)
                result.whole += got == text

        try:
            await asyncio.gather(*(client(text) for text in texts))
        finally:
            done.set()
            await breaking
            for url in decoding:
                await http.post(url + "/sim/faults", json={FAULTS[result.fault]: None})
        result.reasons = await continued(http, metrics_url) - before
        result.continued = result.reasons.total()
        for url in prefilling:
            requests = (await http.get(url + "/sim/requests")).json()["requests"]
            result.prefill_s += [prefill_s(r) for r in requests if continuing(r)]


def continuing(record: dict[str, Any]) -> bool:
    """A request that went on with an answer: its prompt and output so far as token ids,
    its prefill over (a stream's first token out: the server notes the stream's end only
    after its last event has left, which the client may have read before)."""
    body = record["body"]
    named = "prompt_token_ids" in (body.get("kv_transfer_params") or {})
    over = record.get("first_output") or record.get("finished")
    return (named or isinstance(body.get("prompt"), list)) and bool(over)


def prefill_s(record: dict[str, Any]) -> float:
    """A continuation's prefill: a node's prefill request whole, a decode server's stream
    until its first token."""
    end = record.get("first_output") or record["finished"]
    return float(end - record["received"])


async def every_node_in_service(http: httpx.AsyncClient, base_url: str) -> None:
    """Until no node is out (the last round's failures probed back in)."""
    pool = base_url.removesuffix("/v1") + "/admin/pool"
    while (await http.get(pool)).json()["models"][MODEL]["out"]:  # noqa: ASYNC110 (another process)
        await asyncio.sleep(0.1)


async def continued(http: httpx.AsyncClient, metrics_url: str) -> Counter[str]:
    """The gateway's count of answers continued elsewhere, by why their decode broke."""
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families((await http.get(metrics_url)).text):
        for sample in family.samples:
            if sample.name == "pd_gateway_continuations_total" and sample.labels.get("outcome") in (
                "continued",
                "continued_native",
            ):
                counts[sample.labels["reason"]] += round(sample.value)
    return counts


@contextmanager
def pools_of(options: FailoverOptions) -> Iterator[dict[str, tuple[SimStack, BenchGateway]]]:
    """Every pool's stack and gateway, ready, by pool: started together, so that their
    start-ups overlap (each pool then idles while another's rounds run); all stopped on the
    way out."""
    stacks = {
        pool: native_stack(options) if pool == NATIVE else node_stack(pool, options)
        for pool in POOLS
    }
    with ExitStack() as cleanup:
        cleanup.enter_context(started_together(list(stacks.values())))
        workdir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="pd-gw-fo-")))
        gateways: dict[str, BenchGateway] = {}
        cleanup.callback(stop_all, gateways.values())
        for pool, stack in stacks.items():
            folder = workdir / pool.replace(" ", "-")
            gateways[pool] = BenchGateway(gateway_config(pool, stack), folder)
        for gateway in gateways.values():
            gateway.wait_ready()
        yield {pool: (stacks[pool], gateways[pool]) for pool in POOLS}


def gateway_config(pool: str, stack: SimStack) -> dict[str, Any]:
    """The pool's gateway, on the stack's addresses (once it runs)."""
    if pool == NATIVE:
        model = native_model(stack)
    else:
        model = latency_model(stack, MODEL)
        model["latency"].update(
            tilert=release_of(pool), continuations=8, continuation_wait_ms=30_000
        )
    config = {
        "models": [model],
        # A node that failed is back as soon as a probe finds it idle.
        "gate": {
            "max_queue": 256,
            "max_queue_wait_ms": 60_000,
            "node_cooldown_s": 0,
            "probe_interval_s": 0.1,
        },
        "timeouts": {"decode_stall_s": STALL_S},
    }
    if pool == NATIVE:
        config["classification"] = {"rules": {"default": {"name": "native", "path": "throughput"}}}
    return config


def release_of(pool: str) -> str:
    return pool.removeprefix("TileRT ")


def node_stack(pool: str, options: FailoverOptions) -> SimStack:
    release = release_of(pool)
    return SimStack(
        nodes=options.nodes,
        prefills=1,
        model=MODEL,
        one_process=options.one_process,
        node_args=["--step-ms", str(options.step_ms), "--protocol", release],
        prefill_args=[
            "--itl-ms",
            "0",
            "--prefill-ms-per-token",
            str(options.prefill_ms_per_token),
            "--tilert-protocol",
            release,
        ],
    )


def native_stack(options: FailoverOptions) -> SimStack:
    """One prefill server and as many decode servers as the pools have nodes, decoding as
    fast as a node."""
    prefill_ms = str(options.prefill_ms_per_token)
    return SimStack(
        nodes=0,
        prefills=1,
        decodes=options.nodes,
        model=MODEL,
        one_process=options.one_process,
        prefill_args=["--itl-ms", "0", "--prefill-ms-per-token", prefill_ms],
        decode_args=["--itl-ms", str(options.step_ms), "--prefill-ms-per-token", prefill_ms],
    )


def native_model(stack: SimStack) -> dict[str, Any]:
    return {
        "name": MODEL,
        "tokenizer": "deepseek",
        "throughput": {
            "mode": "pull",
            "prefill": [s.url for s in stack.prefills],
            "decode": [s.url for s in stack.decodes],
            "continuations": 8,
        },
    }


def measure(options: FailoverOptions) -> list[Round]:
    rounds = []
    with pools_of(options) as pools:
        for pool, (stack, gateway) in pools.items():
            metrics_url = gateway.base_url.removesuffix("/v1") + "/metrics"
            for fault in NATIVE_FAULTS if pool == NATIVE else FAULTS:
                result = Round(pool, fault)
                uvloop.run(one_round(gateway.base_url, metrics_url, stack, options, result))
                rounds.append(result)
    return rounds


def _ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1e3:.0f}" if values else "-"


def report(rounds: list[Round], options: FailoverOptions, command: str) -> str:
    lines = [
        f"`{command}`: {options.clients} streams on {options.nodes} nodes (or, in `pull`"
        f" mode, decode servers), one made to break its next decode every"
        f" {options.chaos_every_s:g} s ({options.chaos_every_s / options.nodes:g} s in"
        f" `pull` mode); a stall is given up after {STALL_S:g} s.",
        "",
        "| pool | fault | answers | whole | failed | continued | seam p50 ms | seam p99 ms"
        " | continuation prefill p50 ms | TTFT p50 ms | seam p50 − prefill p50 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rounds:
        seams = r.seams_s
        over = (
            f"{(statistics.median(seams) - statistics.median(r.prefill_s)) * 1e3:.0f}"
            if seams and r.prefill_s
            else "-"
        )
        lines.append(
            f"| {r.pool} | {r.fault} | {r.answers} | {r.whole} | {len(r.failed)}"
            f" | {r.continued} | {_ms(seams, 0.5)} | {_ms(seams, 0.99)} | {_ms(r.prefill_s, 0.5)}"
            f" | {_ms(r.ttft_s, 0.5)} | {over} |"
        )
    lines += ["", *_target_lines(rounds)]
    return "\n".join(lines) + "\n"


def _target_lines(rounds: list[Round]) -> list[str]:
    lines = ["| target | measured | met |", "|---|---|---|"]
    for r in rounds:
        whole = r.whole == r.answers and not r.failed
        lines.append(
            f"| {r.pool} {r.fault}: every answer whole | {r.whole}/{r.answers}"
            f" | {'yes' if whole else 'no'} |"
        )
        if r.fault == "died" and r.seams_s and r.prefill_s:
            over_ms = (statistics.median(r.seams_s) - statistics.median(r.prefill_s)) * 1e3
            met = over_ms <= TARGET_SEAM_OVER_PREFILL_MS
            lines.append(
                f"| {r.pool} died: seam p50 within a continuation prefill"
                f" + {TARGET_SEAM_OVER_PREFILL_MS:g} ms | +{over_ms:.0f} ms"
                f" | {'yes' if met else 'no'} |"
            )
    return lines


def run_failover(args: Any, command: str) -> int:
    """`pd-gateway bench --scenario failover`: measure, print the table, write it to the
    output directory and, with `--report`, into that page."""
    from bench.report import publish

    options = FailoverOptions.quick() if args.quick else FailoverOptions()
    publish(report(measure(options), options, command), "failover", Path(args.out), args.report)
    return 0
