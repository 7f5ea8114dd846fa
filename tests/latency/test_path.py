"""The latency path: its choice of prefill server (always one of the node's own release), and
what its answers say beyond the output."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from router.config import LatencyConfig, UpstreamsConfig
from router.errors import UpstreamError
from router.latency.path import LatencyPath, answer_facts
from router.latency.protocol import LatencyDeps
from router.latency.sampling import Sampling, SamplingDefaults
from router.node import Node
from router.node_lifecycle.facts import NodeFactsBook
from router.openai.render import AnswerFacts
from router.openai.requests import ChatRequest
from router.telemetry.metrics import Metrics
from router.tokens.tokenizer import load_tokenizer
from router.upstream import Upstreams
from router.upstream.timeouts import Timeouts
from router.upstream.vllm import Prefilled
from tests.throughput.support import routed

CONFIG = LatencyConfig.model_validate(
    {"tilert": "0.1.6", "prefill": ["http://prefill:8000"], "nodes": [{"host": "old"}]}
)


class Lease:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.released: list[bool] = []

    async def release(self, failure: Any = None, *, reports_health: bool = True) -> None:
        self.released.append(reports_health)


class Gate:
    """Grants a node this path's configuration does not list (a reload added it)."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease

    async def acquire(self, **_: Any) -> Lease:
        return self.lease


async def test_a_node_of_a_release_without_prefill_servers_is_given_back() -> None:
    lease = Lease(Node(host="new", tilert="0.1.5"))
    upstreams = Upstreams(UpstreamsConfig(), Timeouts())
    deps = LatencyDeps(
        upstreams=upstreams,
        timeouts=Timeouts(),
        spawn=lambda coro: pytest.fail("nothing to clean up"),  # type: ignore[arg-type,return-value]
        metrics=Metrics(),
        facts=NodeFactsBook(),
    )
    path = LatencyPath(
        "m",
        CONFIG,
        output_parser="none",
        gate=Gate(lease),  # type: ignore[arg-type]
        tokenizer=load_tokenizer("deepseek", base_dir=Path(".")),
        deps=deps,
        default_wait_ms=0,
        sampling_defaults=SamplingDefaults(),
    )
    request = routed({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    async with AsyncExitStack() as stack:
        with pytest.raises(UpstreamError) as failed:
            await path.open(request, stack)
    assert (failed.value.code, failed.value.status) == ("no_prefill_for_node", 503)
    assert lease.released == [False]
    await upstreams.aclose()


def test_the_answer_carries_the_prefill_servers_fingerprint_and_the_sampling_used() -> None:
    prefilled = Prefilled(
        response_id="chatcmpl-1",
        created=1,
        first_token_id=5,
        prompt_tokens=7,
        finish_reason="length",
        cached_tokens=None,
        system_fingerprint="vllm-0.32.0-8f3995b0",
    )
    messages = [{"role": "user", "content": "hi"}]
    streamed = ChatRequest.model_validate(
        {
            "model": "m",
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 9,
        }
    )
    facts = answer_facts(streamed, prefilled, Sampling(0.5, 0.9, None), max_seq_len=2048)
    assert facts == AnswerFacts(
        system_fingerprint="vllm-0.32.0-8f3995b0",
        include_usage=True,
        temperature=0.5,
        top_p=0.9,
        max_tokens=9,
    )
    # No budget from the client: vLLM's own, what the context leaves after the prompt.
    whole = ChatRequest.model_validate({"model": "m", "messages": messages})
    facts = answer_facts(whole, prefilled, Sampling(1.0, 1.0, None), max_seq_len=2048)
    assert (facts.include_usage, facts.max_tokens) == (False, 2041)
