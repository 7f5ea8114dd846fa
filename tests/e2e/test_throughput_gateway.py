"""The throughput path through a running gateway, checked against what the simulators saw.

One gateway serves three models over one stack: `sim-model` by proxy (to a `both`-role
simulator standing in for the native disaggregation proxy), `sim-pull` by the latency path
or NIXL pull legs, and `sim-push` by NIXL push legs; one prefill simulator serves every
prefill leg. Proxy answers are compared byte for byte with the proxy's own answer to the
same request and X-Request-Id, with only `created` (the server's clock) masked.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from sim.stack import SimStack
from tests.support.classify_fixtures import (
    MODEL,
    REROUTE,
    ROUTE,
    RULE,
    Sims,
    proxy_throughput,
    say,
)
from tests.support.deployment import directive, latency_model
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.legs import (
    nixl_prefill_body,
    pull_decode_params,
    push_decode_params,
    tilert_prefill_body,
)
from tests.support.stacks import StackPool

PULL = "sim-pull"
PUSH = "sim-push"
WHOLE = "sim-whole"  # pull mode that serves prompts of up to 4096 uncached tokens whole
TEXT = "naïve 日本語 🙂 done"
HEX32 = re.compile(r"^[0-9a-f]{32}$")
RULES = {
    "default": {"name": "native", "path": "throughput"},
    "rules": [{"name": "fast", "match": {"headers": {"x-workload": "fast"}}, "path": "latency"}],
}
# A client may not choose where KV state goes: this must never reach an upstream.
HOSTILE = {"kv_transfer_params": {"tilert_host": "10.6.6.6", "tilert_ctrl_port": 1}}


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    # The prefill costs 1 ms per prompt token, so a long prompt shows push-mode overlap.
    return sim_stacks.get(
        nodes=1,
        prefills=1,
        decodes=1,
        proxy=True,
        model=[MODEL, PULL, PUSH, WHOLE],
        node_args=["--step-ms", "5"],
        prefill_args=["--itl-ms", "0", "--prefill-ms-per-token", "1"],
        decode_args=["--itl-ms", "2", "--prefill-ms-per-token", "0"],
        proxy_args=["--itl-ms", "2", "--prefill-ms-per-token", "0"],
    )


@pytest.fixture(scope="module")
def gateway(stack: SimStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    prefill, decode = stack.prefills[0], stack.decodes[0]
    engine = {
        "url": prefill.url,
        "engine_id": prefill.engine_id,
        "side_channel_host": prefill.side_channel_host,
        "side_channel_port": prefill.side_channel_port,
    }
    models = [
        {"name": MODEL, "tokenizer": "deepseek", "throughput": proxy_throughput(stack)},
        latency_model(
            stack,
            PULL,
            throughput={"mode": "pull", "prefill": [prefill.url], "decode": [decode.url]},
        ),
        {
            "name": PUSH,
            "tokenizer": "deepseek",
            "throughput": {"mode": "push", "prefill": [engine], "decode": [decode.url]},
        },
        {
            "name": WHOLE,
            "tokenizer": "deepseek",
            "throughput": {
                "mode": "pull",
                "prefill": [prefill.url],
                "decode": [decode.url],
                "conditional": {"min_uncached_tokens": 4096},
            },
        },
    ]
    with start_gateway(tmp_path_factory, models, classification={"rules": RULES}) as running:
        yield running


def masked(content: bytes) -> bytes:
    return re.sub(rb'"created":\d+', b'"created":0', content)


def streamed_text(content: bytes) -> str:
    """The text a chat SSE body carries (content deltas joined)."""
    text = []
    for event in content.split(b"\n\n"):
        if event.startswith(b"data: {"):
            for choice in orjson.loads(event[len(b"data: ") :])["choices"]:
                text.append(choice["delta"].get("content") or "")
    return "".join(text)


async def test_one_prefill_server_serves_both_paths_at_once(
    sims: Sims, aclient: openai.AsyncOpenAI
) -> None:
    body = {**say(TEXT), "model": PULL}
    fast, native = await asyncio.gather(
        aclient.chat.completions.with_raw_response.create(
            **body, extra_headers={"x-workload": "fast"}
        ),
        aclient.chat.completions.with_raw_response.create(**body),
    )
    assert (fast.headers[ROUTE], fast.headers[RULE]) == ("latency", "fast")
    assert (native.headers[ROUTE], native.headers[RULE]) == ("throughput", "native")
    for answer in (fast, native):
        assert answer.parse().choices[0].message.content == TEXT
    stack = sims.stack
    node = stack.nodes[0]
    legs = {leg["kv_mode"]: leg for leg in await sims.requests(stack.prefills[0].url)}
    assert sorted(legs) == ["nixl_producer", "tilert"]
    assert legs["tilert"]["body"] == tilert_prefill_body(body, node)
    assert legs["nixl_producer"]["body"] == nixl_prefill_body(body)
    transfers = (await sims.http.get(stack.prefills[0].url + "/sim/requests")).json()["transfers"]
    assert [(t["ctrl_port"], t["outcome"]) for t in transfers] == [(node.ctrl_port, "complete")]
    (decode,) = await sims.requests(stack.decodes[0].url)
    assert decode["kv_mode"] == "nixl_consumer_pull"


CHAT = say(TEXT, max_tokens=40)
COMPLETION = {"model": MODEL, "prompt": directive(TEXT), "max_tokens": 40}
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


@pytest.mark.parametrize(
    ("endpoint", "body", "fault"),
    [
        pytest.param("chat", CHAT, None, id="chat"),
        pytest.param("chat", {**CHAT, **STREAM}, None, id="chat-stream"),
        pytest.param("completions", COMPLETION, None, id="completions"),
        pytest.param("completions", {**COMPLETION, **STREAM}, None, id="completions-stream"),
        pytest.param("chat", CHAT, {"http_status": 400}, id="chat-upstream-400"),
        pytest.param("chat", {**CHAT, **STREAM}, {"http_status": 503}, id="stream-upstream-503"),
    ],
)
async def test_proxy_answer_is_byte_for_byte_the_native_proxys_own(
    sims: Sims,
    aclient: openai.AsyncOpenAI,
    endpoint: str,
    body: dict[str, Any],
    fault: dict[str, Any] | None,
) -> None:
    proxy = sims.stack.proxy
    assert proxy is not None
    if fault is not None:
        await sims.arm(proxy.url, {**fault, "count": 2})  # one for the gateway, one direct
    answer, content = await call(aclient, endpoint, body)
    (seen,) = await sims.requests(proxy.url)
    rid = seen["headers"]["x-request-id"]
    assert HEX32.match(rid), "the gateway sets its own request id"
    assert "kv_transfer_params" not in seen["body"]
    assert seen["body"] == body
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    direct = await sims.http.post(proxy.url + path, json=body, headers={"x-request-id": rid})
    assert answer.status_code == direct.status_code == (fault or {}).get("http_status", 200)
    assert answer.headers["content-type"] == direct.headers["content-type"]
    assert masked(content) == masked(direct.content)
    assert (answer.headers[ROUTE], answer.headers[RULE]) == ("throughput", "native")
    assert REROUTE not in answer.headers


async def test_pull_legs_carry_the_protocols_parameters_and_one_request_id(
    sims: Sims, aclient: openai.AsyncOpenAI
) -> None:
    body = {**say(TEXT, **STREAM), "model": PULL}
    answer, content = await call(
        aclient,
        "chat",
        body,
        vllm={"min_tokens": 2},
        headers={"x-workload": "fast", "x-request-id": "client-chosen-7"},
    )
    # The rule says latency; the guard moves it: the TileRT node cannot honour min_tokens.
    assert (answer.headers[ROUTE], answer.headers[RULE]) == ("throughput", "fast")
    assert answer.headers[REROUTE] == "min_tokens"
    assert streamed_text(content) == TEXT
    stack = sims.stack
    server = stack.prefills[0]
    (prefill,) = await sims.requests(server.url)
    (decode,) = await sims.requests(stack.decodes[0].url)
    rid = prefill["headers"]["x-request-id"]
    assert HEX32.match(rid) and decode["headers"]["x-request-id"] == rid
    assert prefill["kv_mode"] == "nixl_producer"
    assert prefill["body"] == nixl_prefill_body(
        {k: v for k, v in body.items() if k != "stream_options"}
    )
    # The decode leg carries exactly what the prefill answered: the simulated producer's
    # parameters for this prompt (vLLM 0.32's keys), naming the request id; a stream
    # asks for its chunks' ids, to go on elsewhere if its server breaks.
    assert decode["kv_mode"] == "nixl_consumer_pull"
    assert decode["body"] == {
        **body,
        "min_tokens": 2,
        "kv_transfer_params": pull_decode_params(server, rid, decode_prompt_tokens(content)),
        "return_token_ids": True,
    }


async def test_push_legs_run_concurrently_and_name_the_prefill_engine(
    sims: Sims, aclient: openai.AsyncOpenAI
) -> None:
    # About 400 prompt tokens at 1 ms each: the decode leg arrives while the prefill computes.
    prompt = " ".join(["filler"] * 400) + directive(TEXT)
    body = {"model": PUSH, "prompt": prompt, "max_tokens": 40}
    raw = await aclient.completions.with_raw_response.create(**body, extra_body=HOSTILE)
    assert raw.parse().choices[0].text == TEXT
    assert (raw.headers[ROUTE], raw.headers[RULE]) == ("throughput", "native")
    stack = sims.stack
    server = stack.prefills[0]
    (prefill,) = await sims.requests(server.url)
    (decode,) = await sims.requests(stack.decodes[0].url)
    rid = prefill["headers"]["x-request-id"]
    assert HEX32.match(rid) and decode["headers"]["x-request-id"] == rid
    assert prefill["body"] == nixl_prefill_body(body)
    assert decode["kv_mode"] == "nixl_consumer_push"
    assert decode["body"] == {**body, "kv_transfer_params": push_decode_params(server, rid)}
    assert decode["received"] < prefill["finished"], "the decode leg waited for the prefill"


async def call(
    client: openai.AsyncOpenAI,
    endpoint: str,
    body: dict[str, Any],
    *,
    vllm: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[httpx.Response, bytes]:
    """The SDK's call plus vLLM-only fields and a hostile `kv_transfer_params`; the raw
    response and its bytes, error statuses included."""
    resource = client.chat.completions if endpoint == "chat" else client.completions
    try:
        async with resource.with_streaming_response.create(
            **body, extra_body={**HOSTILE, **(vllm or {})}, extra_headers=headers
        ) as answer:
            return answer.http_response, await answer.read()
    except openai.APIStatusError as exc:
        return exc.response, await exc.response.aread()


def decode_prompt_tokens(content: bytes) -> int:
    for event in content.split(b"\n\n"):
        if event.startswith(b"data: {") and b'"usage":{' in event:
            return orjson.loads(event[len(b"data: ") :])["usage"]["prompt_tokens"]
    raise AssertionError("no usage event in the stream")


@pytest.mark.parametrize(
    ("model", "served_by"),
    [(MODEL, "proxy"), (PULL, "decode"), (PUSH, "decode")],
    ids=["proxy", "pull", "push"],
)
async def test_responses_go_whole_to_vllms_own_endpoint(
    sims: Sims, aclient: openai.AsyncOpenAI, model: str, served_by: str
) -> None:
    body = {"model": model, "input": directive(TEXT), "max_output_tokens": 40}
    raw = await aclient.responses.with_raw_response.create(**body)
    assert raw.headers[ROUTE] == "throughput"
    assert raw.parse().output_text == TEXT
    stack = sims.stack
    upstream = stack.proxy if served_by == "proxy" else stack.decodes[0]
    assert upstream is not None
    (seen,) = await sims.requests(upstream.url)
    assert (seen["path"], seen["body"]) == ("/v1/responses", body)
    assert HEX32.match(seen["headers"]["x-request-id"])
    # vLLM's Responses endpoint takes no kv_transfer_params: no prefill leg.
    assert await sims.requests(stack.prefills[0].url) == []


async def test_a_responses_stream_failing_mid_way_ends_with_a_responses_error_event(
    sims: Sims, aclient: openai.AsyncOpenAI
) -> None:
    proxy = sims.stack.proxy
    assert proxy is not None
    await sims.arm(proxy.url, {"die_after": 5, "count": 1})
    body = {"model": MODEL, "input": directive(TEXT), "max_output_tokens": 40, "stream": True}
    raw = await aclient.responses.with_raw_response.create(**body)
    events = [event async for event in raw.parse()]
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert len(events) == 6  # five relayed, then the gateway's
    assert events[-1].type == "error"
    assert events[-1].code == "proxy_failed"
    assert "failed mid-stream" in events[-1].message


async def scraped(http: httpx.AsyncClient, gateway: GatewayProcess) -> dict[str, float]:
    """The gateway's throughput figures for MODEL, summed over their other labels."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {
        "pd_gateway_prompt_tokens_total",
        "pd_gateway_completion_tokens_total",
        "pd_gateway_ttft_seconds_count",
        "pd_gateway_inter_token_seconds_count",
        "pd_gateway_request_seconds_count",
    }
    text = (await http.get(gateway.url + "/metrics")).text
    figures = dict.fromkeys(wanted, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name in wanted and labels.get("model") == MODEL:
                assert labels["path"] == "throughput"
                assert labels.get("key", "unknown") == "unknown", "no configured keys"
                figures[sample.name] += sample.value
    return figures


async def test_a_native_stream_is_measured_from_its_own_usage(
    sims: Sims, aclient: openai.AsyncOpenAI, gateway: GatewayProcess
) -> None:
    before = await scraped(sims.http, gateway)
    _, content = await call(aclient, "chat", {**CHAT, **STREAM})
    last = [e for e in content.split(b"\n\n") if e.startswith(b"data: {")][-1]
    usage = orjson.loads(last[len(b"data: ") :])["usage"]
    after = await scraped(sims.http, gateway)
    grown = {name: after[name] - before[name] for name in after}
    assert grown["pd_gateway_prompt_tokens_total"] == usage["prompt_tokens"] > 0
    assert grown["pd_gateway_completion_tokens_total"] == usage["completion_tokens"] > 0
    assert grown["pd_gateway_ttft_seconds_count"] == 1
    assert grown["pd_gateway_inter_token_seconds_count"] > 0
    assert grown["pd_gateway_request_seconds_count"] == 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_native_responses_answer_is_counted_from_its_own_usage(
    sims: Sims, aclient: openai.AsyncOpenAI, gateway: GatewayProcess, stream: bool
) -> None:
    before = await scraped(sims.http, gateway)
    body = {"model": MODEL, "input": directive(TEXT), "max_output_tokens": 40}
    if stream:
        events = [e async for e in await aclient.responses.create(**body, stream=True)]
        assert events[-1].type == "response.completed"
        usage = events[-1].response.usage
    else:
        usage = (await aclient.responses.create(**body)).usage
    assert usage is not None
    after = await scraped(sims.http, gateway)
    grown = {name: after[name] - before[name] for name in after}
    assert grown["pd_gateway_prompt_tokens_total"] == usage.input_tokens > 0
    assert grown["pd_gateway_completion_tokens_total"] == usage.output_tokens > 0
    assert grown["pd_gateway_request_seconds_count"] == 1


async def test_a_prompt_that_does_not_pay_for_a_split_is_served_whole_and_said_so(
    sims: Sims, gateway: GatewayProcess
) -> None:
    body = {**say(TEXT), "model": WHOLE}
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as http:
        whole = await http.post("/chat/completions", json=body)
        split = await http.post("/chat/completions", json={**body, "model": PULL})
    assert whole.status_code == split.status_code == 200
    assert whole.json()["choices"][0]["message"]["content"] == TEXT
    assert whole.headers["x-pd-native"] == "whole; reason=cached"
    assert split.headers["x-pd-native"] == "split; reason=always"
    stack = sims.stack
    prefilled = await sims.requests(stack.prefills[0].url)
    assert [r["body"]["model"] for r in prefilled] == [PULL]  # none for the whole one
    decoded = await sims.requests(stack.decodes[0].url)
    assert [r["body"]["model"] for r in decoded] == [WHOLE, PULL]
    assert decoded[0]["body"] == body  # the client's own, prefill included
    metrics = (await asyncio.to_thread(httpx.get, gateway.url + "/metrics")).text
    line = 'pd_gateway_native_requests_total{model="sim-whole",reason="cached",way="whole"} 1.0'
    assert line in metrics.splitlines()
