"""What does each step a native stream's chunk goes through in the gateway cost, per chunk
and per 256-token answer: the meter (time to first token, gaps, usage, finish, errors),
the usage chunk's removal, the continuation's track of ids (`pull` and `push` mode), the
cached-tokens rewrite (`pull` mode), and each path's chain of them as `forward` builds it?
And what does every request pay for tenants' rate limits where none are configured?

Feeds the same chunks vLLM 0.32 sends for a streamed chat answer (one event a token; with
`return_token_ids` their ids, as the decode leg of `pull` mode asks; the finishing chunk,
the usage chunk and `[DONE]`) through each step in this process, many answers in a row,
timed with `time.process_time` (other load on the machine does not count). What the event
loop, the sockets and the ASGI server cost per chunk is not in it: `pd-gateway bench`
measures the whole process. Run: `python -m bench.experiments.chunk_costs [--answers N]`.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import time
from collections.abc import Callable, Coroutine
from typing import Any

import orjson

from policies import Decision
from router.config import TenantsConfig
from router.openai.endpoints import ENDPOINTS
from router.openai.requests import ChatRequest
from router.serving import RoutedRequest
from router.telemetry.metrics import Metrics
from router.tenants.admission import Tenants
from router.tenants.identity import DEFAULT_TENANT
from router.tenants.limiter import MemoryLimiter
from router.throughput.answer import Chained, ChunkFilter
from router.throughput.continuation import StreamTrack
from router.throughput.meter import AnswerMeter
from router.throughput.stream_usage import UsageChunkDropper
from router.throughput.usage import CachedTokensRewriter

TOKENS = 256
DECISION = Decision(
    path="throughput", rule="bench", priority=0, on_saturation="queue", max_queue_wait_ms=None
)


def chunks(*, ids: bool) -> list[bytes]:
    """A streamed chat answer of `TOKENS` tokens as vLLM sends it, one event a chunk."""
    head: dict[str, object] = {"id": "chatcmpl-0123456789abcdef", "created": 1765000000}
    head |= {"object": "chat.completion.chunk", "model": "bench"}
    events = []
    for i in range(TOKENS):
        choice: dict[str, object] = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""} if i == 0 else {"content": f" w{i}"},
            "logprobs": None,
            "finish_reason": None,
        }
        if ids:
            choice["token_ids"] = [1000 + i]
        event: dict[str, object] = {**head, "choices": [choice]}
        if ids and i == 0:
            event["prompt_token_ids"] = list(range(100, 140))
        events.append(event)
    events.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    usage = {"prompt_tokens": 40, "completion_tokens": TOKENS, "total_tokens": TOKENS + 40}
    events.append({**head, "choices": [], "usage": usage})
    return [b"data: " + orjson.dumps(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def request() -> RoutedRequest:
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    parsed = ChatRequest.model_validate(body)
    return RoutedRequest(ENDPOINTS["chat"], parsed, body, DECISION, "rid", {})


def per_chunk_us(answer: Callable[[], None], answers: int, chunks_per_answer: int) -> float:
    answer()  # warm
    started = time.process_time()
    for _ in range(answers):
        answer()
    return (time.process_time() - started) / (answers * chunks_per_answer) * 1e6


def filtered(make: Callable[[], ChunkFilter], stream: list[bytes]) -> Callable[[], None]:
    def answer() -> None:
        step = make()
        for chunk in stream:
            step.feed(chunk)
        step.flush()

    return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=400)
    answers = parser.parse_args().answers
    plain, with_ids = chunks(ids=False), chunks(ids=True)
    metrics = Metrics()

    def metered(stream: list[bytes]) -> Callable[[], None]:
        def answer() -> None:
            meter = AnswerMeter(request(), metrics)
            for chunk in stream:
                meter.chunk(chunk)
            meter.close()

        return answer

    def proxy_chain() -> ChunkFilter:
        return UsageChunkDropper(None)

    def pull_chain() -> ChunkFilter:
        rewrite = CachedTokensRewriter(0)
        return UsageChunkDropper(Chained(StreamTrack(keep_ids=False), rewrite))

    def pull_without_track() -> ChunkFilter:
        return UsageChunkDropper(CachedTokensRewriter(0))

    steps: list[tuple[str, Callable[[], None], int]] = [
        ("meter (time, gaps, usage, finish)", metered(plain), len(plain)),
        ("usage chunk removal", filtered(lambda: UsageChunkDropper(None), plain), len(plain)),
        ("cached-tokens rewrite", filtered(lambda: CachedTokensRewriter(0), plain), len(plain)),
        (
            "continuation track (ids out)",
            filtered(lambda: StreamTrack(keep_ids=False), with_ids),
            len(with_ids),
        ),
        (
            "proxy mode: meter + removal",
            _both(metered(plain), filtered(proxy_chain, plain)),
            len(plain),
        ),
        (
            "pull mode: meter + track + rewrite + removal",
            _both(metered(with_ids), filtered(pull_chain, with_ids)),
            len(with_ids),
        ),
        (
            "pull mode, continuations: 0",
            _both(metered(plain), filtered(pull_without_track, plain)),
            len(plain),
        ),
    ]
    print(f"Python {platform.python_version()}, {answers} answers of {TOKENS} tokens each")
    print(f"{'step':48} {'µs / chunk':>10} {'ms / answer':>12}")
    for name, answer, count in steps:
        cost = min(per_chunk_us(answer, answers, count) for _ in range(3))
        print(f"{name:48} {cost:10.2f} {cost * count / 1e3:12.3f}")
    admission = min(asyncio.run(_admission_us(answers * 50)) for _ in range(3))
    print(f"{'tenant admission, no tenants configured':48} {'':10} {admission / 1e3:12.4f}")


async def _admission_us(requests: int) -> float:
    """A request's admission as the dispatcher asks for it, with no tenant configured."""
    tenants = Tenants(TenantsConfig(), MemoryLimiter(), Metrics(), _no_spawn)
    started = time.process_time()
    for _ in range(requests):
        await tenants.admit(DEFAULT_TENANT, 300, model="bench", node_use="none")
    return (time.process_time() - started) / requests * 1e6


def _no_spawn(coroutine: Coroutine[Any, Any, None]) -> None:
    coroutine.close()


def _both(first: Callable[[], None], then: Callable[[], None]) -> Callable[[], None]:
    def answer() -> None:
        first()
        then()

    return answer


if __name__ == "__main__":
    main()
