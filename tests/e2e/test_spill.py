"""Spill, reject and queue through a running gateway, when the TileRT pool is saturated or
fails before the first byte.

A rule with `on_saturation: spill` must give the client a normal answer from the throughput
path (headers `x-pd-route: throughput` and `x-pd-reroute-reason: <code>`) whatever failed
before anything was sent; `reject` and a spent `queue` budget answer 429 with Retry-After;
a prefill 4xx is the client's own error and is passed on, not spilled. After every test
each slot is free and no node ever ran two decodes at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from sim.stack import SimStack
from tests.support.classify_fixtures import (
    MODEL,
    REROUTE,
    ROUTE,
    RULE,
    Sims,
    closed_node,
    closed_port,
    held_nodes,
    proxy_throughput,
    say,
    wait_until,
)
from tests.support.deployment import directive, latency_model, node_entry
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.stacks import StackPool

DEAD_NODE = "sim-dead-node"  # its only node entry points at closed ports
NO_PREFILL = "sim-no-prefill"  # its prefill URL points at a closed port
TEXT = "spilled over, ça marche 🙂"
RULES = {
    "default": {
        "name": "spill",
        "path": "latency",
        "on_saturation": "spill",
        "max_queue_wait_ms": 100,
    },
    "rules": [
        {
            "name": "reject",
            "match": {"headers": {"x-saturation": "reject"}},
            "path": "latency",
            "on_saturation": "reject",
        },
        {
            "name": "queue",
            "match": {"headers": {"x-saturation": "queue"}},
            "path": "latency",
            "on_saturation": "queue",
            "max_queue_wait_ms": 200,
        },
        {
            "name": "patient",
            "match": {"headers": {"x-saturation": "patient"}},
            "path": "latency",
            "on_saturation": "queue",
            "max_queue_wait_ms": 20_000,
        },
    ],
}


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=3,  # two for MODEL, one for NO_PREFILL (a node serves one pool)
        prefills=1,
        proxy=True,
        model=[MODEL, DEAD_NODE, NO_PREFILL],
        node_args=["--step-ms", "5"],
        prefill_args=["--itl-ms", "0"],
        proxy_args=["--itl-ms", "1"],
    )


@pytest.fixture(scope="module")
def gateway(stack: SimStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    throughput = proxy_throughput(stack)
    models = [
        latency_model(stack, MODEL, nodes=stack.nodes[:2], throughput=throughput),
        {
            "name": DEAD_NODE,
            "tokenizer": "deepseek",
            "latency": {"prefill": [stack.prefills[0].url], "nodes": [closed_node()]},
            "throughput": throughput,
        },
        {
            "name": NO_PREFILL,
            "tokenizer": "deepseek",
            # A live node (the start-up probe takes a dead one out of service at once);
            # nothing ever reaches it, since the prefill fails first.
            "latency": {
                "prefill": [f"http://127.0.0.1:{closed_port()}"],
                "nodes": [node_entry(stack.nodes[2])],
            },
            "throughput": throughput,
        },
    ]
    with start_gateway(
        tmp_path_factory,
        models,
        gate={"max_queue": 1},
        # A short transfer timeout keeps the 504 case quick; a long stall timeout lets the
        # streams that hold the nodes stay silent for as long as a test needs them.
        timeouts={"kv_transfer_s": 1, "decode_stall_s": 20},
        classification={"rules": RULES},
    ) as running:
        yield running


async def answer(client: openai.AsyncOpenAI, *, stream: bool, **extra: Any) -> tuple[Any, str]:
    """Send a chat call; the raw response (for headers) and the text the client assembled."""
    raw = await client.chat.completions.with_raw_response.create(
        **say(TEXT, stream=stream, **extra)
    )
    if not stream:
        return raw, raw.parse().choices[0].message.content
    parts = [c.choices[0].delta.content or "" async for c in raw.parse() if c.choices]
    return raw, "".join(parts)


async def assert_spilled(sims: Sims, raw: Any, text: str, *, reason: str) -> None:
    assert raw.status_code == 200
    assert text == TEXT
    headers = raw.headers
    assert (headers[ROUTE], headers[RULE], headers[REROUTE]) == ("throughput", "spill", reason)
    assert sims.stack.proxy is not None
    assert len(await sims.requests(sims.stack.proxy.url)) == 1, "the throughput path answered"


async def test_spills_when_every_node_is_held_and_the_wait_budget_is_spent(
    gateway: GatewayProcess, sims: Sims, aclient: openai.AsyncOpenAI
) -> None:
    async with held_nodes(gateway, sims, count=2):
        raw, text = await answer(aclient, stream=False)
    await assert_spilled(sims, raw, text, reason="wait_timeout")


async def test_spills_when_the_queue_is_full_and_the_waiter_gets_the_next_slot(
    gateway: GatewayProcess, sims: Sims, aclient: openai.AsyncOpenAI
) -> None:
    async with held_nodes(gateway, sims, count=2) as holders:
        waiter = asyncio.create_task(
            answer(aclient, stream=False, extra_headers={"x-saturation": "patient"})
        )

        async def queued() -> bool:
            return (await sims.pool(gateway))["waiting"] == 1

        await wait_until(queued, what="the patient request to wait in the queue")
        raw, text = await answer(aclient, stream=True)
        await assert_spilled(sims, raw, text, reason="queue_full")
        await holders[0].aclose()  # frees one node: it goes straight to the waiter
        waited, waited_text = await waiter
    assert (waited.headers[ROUTE], waited.headers[RULE]) == ("latency", "patient")
    assert REROUTE not in waited.headers
    assert waited_text == TEXT


# (model, simulator to arm, fault, reroute reason). Each fails before the first byte.
FAILURES = [
    pytest.param(MODEL, "prefill", {"http_status": 503}, "prefill_failed", id="prefill-503"),
    pytest.param(MODEL, "prefill", {"http_status": 500}, "prefill_failed", id="prefill-500"),
    pytest.param(NO_PREFILL, None, None, "prefill_unreachable", id="prefill-unreachable"),
    pytest.param(
        MODEL, "prefill", {"transfer_no_done": True}, "kv_transfer_timeout", id="transfer-timeout"
    ),
    pytest.param(MODEL, "nodes", {"decode_500": True}, "decode_failed", id="node-500"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(("model", "target", "fault", "reason"), FAILURES)
async def test_spills_on_each_failure_before_the_first_byte(
    sims: Sims,
    aclient: openai.AsyncOpenAI,
    model: str,
    target: str | None,
    fault: dict[str, Any] | None,
    reason: str,
    stream: bool,
) -> None:
    stack = sims.stack
    targets = {"prefill": [stack.prefills[0].url], "nodes": [n.url for n in stack.nodes]}
    for url in targets.get(target or "", []):
        await sims.arm(url, {**(fault or {}), "count": 1})
    raw, text = await answer(aclient, stream=stream, model=model)
    await assert_spilled(sims, raw, text, reason=reason)
    if model != NO_PREFILL:
        (prefill,) = await sims.requests(stack.prefills[0].url)
        assert "tilert_host" in prefill["body"]["kv_transfer_params"], "the latency path was tried"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_spilled_responses_call_reaches_vllms_responses_endpoint_unchanged(
    sims: Sims, aclient: openai.AsyncOpenAI, stream: bool
) -> None:
    stack = sims.stack
    await sims.arm(stack.prefills[0].url, {"http_status": 503, "count": 1})
    body = {"model": MODEL, "input": directive(TEXT), "max_output_tokens": 40}
    raw = await aclient.responses.with_raw_response.create(**body, stream=stream)
    if stream:
        events = [event async for event in raw.parse()]
        assert events[-1].type == "response.completed"
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    else:
        text = raw.parse().output_text
    assert text == TEXT
    assert (raw.headers[ROUTE], raw.headers[REROUTE]) == ("throughput", "prefill_failed")
    (tried,) = await sims.requests(stack.prefills[0].url)
    assert tried["path"] == "/v1/chat/completions", "the latency path was tried as chat"
    assert stack.proxy is not None
    (seen,) = await sims.requests(stack.proxy.url)
    assert (seen["path"], seen["body"]) == ("/v1/responses", {**body, "stream": stream})


async def test_a_node_down_at_start_up_is_out_of_service_and_spills_at_once(
    sims: Sims, aclient: openai.AsyncOpenAI
) -> None:
    """The gateway probed the node at start-up and found nothing listening: requests spill
    at once (`no_node`), with no prefill for a node that cannot decode."""
    for stream in (False, True):
        await sims.reset()
        raw, text = await answer(aclient, stream=stream, model=DEAD_NODE)
        await assert_spilled(sims, raw, text, reason="no_node")
        assert await sims.requests(sims.stack.prefills[0].url) == []


async def test_a_prefill_4xx_is_the_clients_error_and_is_not_spilled(
    sims: Sims, aclient: openai.AsyncOpenAI
) -> None:
    await sims.arm(sims.stack.prefills[0].url, {"http_status": 400, "count": 1})
    with pytest.raises(openai.BadRequestError) as caught:
        await answer(aclient, stream=False)
    headers = caught.value.response.headers
    assert (headers[ROUTE], headers[RULE]) == ("latency", "spill")
    assert REROUTE not in headers
    assert sims.stack.proxy is not None
    assert await sims.requests(sims.stack.proxy.url) == []


@pytest.mark.parametrize("saturation", ["reject", "queue"])
async def test_saturation_answers_429_with_retry_after(
    gateway: GatewayProcess, sims: Sims, aclient: openai.AsyncOpenAI, saturation: str
) -> None:
    """`reject` at once, `queue` once its 200 ms budget is spent; the pool is never bypassed."""
    async with held_nodes(gateway, sims, count=2):
        with pytest.raises(openai.RateLimitError) as caught:
            await answer(aclient, stream=True, extra_headers={"x-saturation": saturation})
    response = caught.value.response
    assert response.status_code == 429
    assert int(response.headers["retry-after"]) >= 1
    assert (response.headers[ROUTE], response.headers[RULE]) == ("latency", saturation)
    assert REROUTE not in response.headers
    expected = {"reject": "pool_saturated", "queue": "wait_timeout"}[saturation]
    assert response.json()["error"]["code"] == expected
    assert sims.stack.proxy is not None
    assert await sims.requests(sims.stack.proxy.url) == []
