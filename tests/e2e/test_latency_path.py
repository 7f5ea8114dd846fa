"""The latency path end to end: the real OpenAI SDK -> the gateway (a real process) ->
simulated vLLM prefill and TileRT nodes (real processes), happy and unhappy paths.

Every test ends by checking that the gateway holds no slot and runs no cleanup, and the
failure tests also check what the nodes saw.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator

import httpx
import openai
import orjson
import pytest

from sim.stack import SimStack
from tests.support.deployment import (
    directive,
    latency_model,
    node_entry,
    request_decodes,
    sim_get,
    sim_post,
)
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.http import plain
from tests.support.stacks import StackPool, latency_stack

pytestmark = pytest.mark.usefixtures("fresh_sims", "all_slots_free")

SCRIPTED = "Hello, wörld! 你好世界 🌍🚀 — naïve café. Done."
MESSAGES = b'{"model": "ds", "messages": [{"role": "user", "content": "x"}]}'
CLOSED_PORT = 9  # discard: nothing listens there on a test machine


@pytest.fixture(scope="module")
def stack(tilert_version: str, sim_stacks: StackPool) -> SimStack:
    return latency_stack(sim_stacks, tilert_version)


@pytest.fixture(scope="module")
def gateway(
    stack: SimStack, tilert_version: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    v = tilert_version
    models = [
        latency_model(stack, "ds", nodes=stack.nodes[:2], output_parser="deepseek_v32", tilert=v),
        # Its answers end with an error event when their node fails (no continuation).
        latency_model(stack, "solo", nodes=stack.nodes[2:3], tilert=v, continuations=0),
        {
            "name": "deadprefill",
            "tokenizer": "deepseek",
            "latency": {
                "tilert": v,
                "prefill": [f"http://127.0.0.1:{CLOSED_PORT}"],
                "nodes": [node_entry(stack.nodes[3])],
            },
        },
    ]
    with start_gateway(tmp_path_factory, models, gate={"max_queue_wait_ms": 5000}) as running:
        yield running


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def prefill_requests(stack: SimStack) -> list[dict]:
    return sim_get(stack.prefills[0].url, "/sim/requests")["requests"]


def node_decodes(stack: SimStack, index: int) -> list[dict]:
    """The node's decodes for requests (the gateway's flushes left out)."""
    return request_decodes(sim_get(stack.nodes[index].url, "/sim/records")["decodes"])


def all_decodes(stack: SimStack) -> list[dict]:
    return [d for i in range(len(stack.nodes)) for d in node_decodes(stack, i)]


def assert_nodes_idle(stack: SimStack) -> None:
    for node in stack.nodes:
        assert sim_get(node.url, "/decode_status") == {"status": "idle", "current_rid": None}


# -- happy paths ---------------------------------------------------------------------


def test_chat_non_stream_returns_the_scripted_text(client: openai.OpenAI, stack: SimStack) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="ds", messages=user(directive(SCRIPTED))
    )
    reply = raw.parse()
    assert raw.headers["x-pd-route"] == "latency"
    assert reply.model == "ds"
    assert reply.choices[0].message.content == SCRIPTED
    assert reply.choices[0].finish_reason == "stop"
    usage = reply.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    request = prefill_requests(stack)[0]
    assert reply.id == f"chatcmpl-{request['headers']['x-request-id']}"
    assert usage.prompt_tokens > 0


def test_chat_stream_equals_non_stream(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(model="ds", messages=user(directive(SCRIPTED)))
    stream = client.chat.completions.create(
        model="ds",
        messages=user(directive(SCRIPTED)),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == SCRIPTED == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage == full.usage
    assert len(chunks) > 3, "streamed as the node's lines arrived, not in one piece"


async def test_async_client_completions_stream_and_not(aclient: openai.AsyncOpenAI) -> None:
    prompt = directive(SCRIPTED)
    full, stream = await asyncio.gather(
        aclient.completions.create(model="ds", prompt=prompt, max_tokens=200),
        aclient.completions.create(model="ds", prompt=prompt, max_tokens=200, stream=True),
    )
    assert full.object == "text_completion"
    assert full.choices[0].text == SCRIPTED
    assert "".join([c.choices[0].text async for c in stream]) == SCRIPTED


def test_completions_default_to_sixteen_tokens(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="ds", prompt="tell me a long story")
    assert reply.usage.completion_tokens == 16
    assert reply.choices[0].finish_reason == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_split_across_tokens(
    client: openai.OpenAI, stack: SimStack, stream: bool
) -> None:
    text = "alpha beta gammadelta epsilon zeta eta theta iota kappa lambda"
    kwargs = {"model": "ds", "messages": user(directive(text)), "stop": ["madel", "nope"]}
    if stream:
        chunks = list(client.chat.completions.create(**kwargs, stream=True))
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = chunks[-1].choices[0].finish_reason
    else:
        reply = client.chat.completions.create(**kwargs)
        content, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
    assert content == "alpha beta gam"
    assert finish == "stop"


def test_stop_cancels_the_node(
    client: openai.OpenAI, stack: SimStack, gateway: GatewayProcess
) -> None:
    sim_post(stack.nodes[2].url, "/sim/faults", {"stall_after": 6})
    reply = client.chat.completions.create(
        model="solo",
        messages=user(directive("one two three four five six seven")),
        stop=["three"],
    )
    assert reply.choices[0].message.content == "one two "
    gateway.wait_all_free()
    assert [d["finish_reason"] for d in node_decodes(stack, 2)] == ["cancelled"]
    assert_nodes_idle(stack)


def test_stop_token_ids(client: openai.OpenAI, stack: SimStack) -> None:
    probe = client.completions.create(model="ds", prompt=directive("a b c d"), max_tokens=50)
    assert probe.choices[0].text == "a b c d"
    # " c" is one token in DeepSeek's vocabulary: ask the gateway to stop on it
    from tests.detokenize.test_pipeline import TOKENIZER

    stop_id = TOKENIZER.encode(" c", add_special_tokens=False).ids[0]
    reply = client.completions.create(
        model="ds",
        prompt=directive("a b c d"),
        max_tokens=50,
        extra_body={"stop_token_ids": [stop_id]},
    )
    assert reply.choices[0].text == "a b"
    assert reply.choices[0].finish_reason == "stop"


def test_max_tokens_one_still_consumes_the_transfer(client: openai.OpenAI, stack: SimStack) -> None:
    reply = client.chat.completions.create(
        model="ds", messages=user(directive(SCRIPTED)), max_tokens=1
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 1
    assert reply.choices[0].message.content == "Hello"
    decodes = all_decodes(stack)
    assert len(decodes) == 1 and decodes[0]["n"] == 1


def test_sampling_and_budget_reach_the_node(client: openai.OpenAI, stack: SimStack) -> None:
    client.chat.completions.create(
        model="ds",
        messages=user("hi"),
        max_completion_tokens=7,
        temperature=0.5,
        top_p=0.9,
        extra_body={"top_k": 20},
    )
    body = prefill_requests(stack)[0]["body"]
    assert body["max_completion_tokens"] == 1 and body["max_tokens"] == 1
    assert body["logprobs"] is True and body["top_logprobs"] == 1
    (decode,) = all_decodes(stack)
    assert decode["request"]["max_tokens"] == 7
    assert decode["request"]["sampling"] == {"temperature": 0.5, "top_p": 0.9, "top_k": 20}
    assert decode["request"]["stream"] is True


def test_client_kv_transfer_params_never_reach_the_backend(
    client: openai.OpenAI, stack: SimStack
) -> None:
    client.chat.completions.create(
        model="solo",
        messages=user("hi"),
        extra_body={"kv_transfer_params": {"tilert_host": "203.0.113.9", "tilert_ctrl_port": 1}},
    )
    params = prefill_requests(stack)[0]["body"]["kv_transfer_params"]
    assert params == {
        "tilert_host": stack.nodes[2].host,
        "tilert_ctrl_port": stack.nodes[2].ctrl_port,
    }


# -- failures before the first byte: an OpenAI error, the slot released ---------------


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def post_chat(gateway: GatewayProcess, body: dict, **kwargs) -> httpx.Response:
    return plain().post(gateway.base_url + "/chat/completions", json=body, timeout=30, **kwargs)


@pytest.mark.parametrize(("status", "expected"), [(500, 502), (503, 503), (400, 400), (422, 422)])
def test_prefill_error_status_is_mapped(
    gateway: GatewayProcess, stack: SimStack, status: int, expected: int
) -> None:
    sim_post(stack.prefills[0].url, "/sim/faults", {"http_status": status, "count": 1})
    response = post_chat(gateway, {"model": "ds", "messages": user("hi")})
    assert response.status_code == expected
    error = error_of(response)
    if status < 500:  # the client's own request refused: vLLM's error body as it sent it
        assert error == {
            "message": f"simulated failure (HTTP {status})",
            "type": "BadRequestError" if status == 400 else "UnprocessableEntityError",
            "param": None,
            "code": status,
        }
    else:
        assert f"answered {status}" in error["message"]
    assert response.headers["x-pd-route"] == "latency"
    gateway.wait_all_free()
    assert all_decodes(stack) == [], "nothing reaches a node after a failed prefill"


def test_prefill_without_token_ids_names_the_flag_and_consumes_the_transfer(
    gateway: GatewayProcess, stack: SimStack
) -> None:
    sim_post(stack.prefills[0].url, "/sim/faults", {"text_logprobs": True, "count": 1})
    response = post_chat(gateway, {"model": "solo", "messages": user("hi")})
    assert response.status_code == 502
    assert "--return-tokens-as-token-ids" in error_of(response)["message"]
    gateway.wait_all_free()
    (decode,) = node_decodes(stack, 2)
    assert decode["request"]["max_tokens"] == 1, "the claimed transfer was consumed"
    assert_nodes_idle(stack)


def test_prefill_unreachable(gateway: GatewayProcess) -> None:
    response = post_chat(gateway, {"model": "deadprefill", "messages": user("hi")})
    assert response.status_code == 502
    assert error_of(response)["code"] == "prefill_unreachable"


def test_transfer_timeout_is_504(gateway: GatewayProcess, stack: SimStack) -> None:
    sim_post(stack.prefills[0].url, "/sim/faults", {"transfer_no_done": True, "count": 1})
    response = post_chat(gateway, {"model": "solo", "messages": user("hi")})
    assert response.status_code == 504
    assert error_of(response)["code"] == "kv_transfer_timeout"
    assert [d["status"] for d in node_decodes(stack, 2)] == [504]


def test_node_500(gateway: GatewayProcess, stack: SimStack) -> None:
    sim_post(stack.nodes[2].url, "/sim/faults", {"decode_500": True, "count": 1})
    response = post_chat(gateway, {"model": "solo", "messages": user("hi")})
    assert response.status_code == 502
    assert error_of(response)["code"] == "decode_failed"


def test_node_busy_429_is_503_and_the_node_is_cleaned_up_before_reuse(
    gateway: GatewayProcess, stack: SimStack
) -> None:
    node = stack.nodes[2]
    # Another client (not the gateway) occupies the node: a decode waiting for a transfer.
    # It drops our transfer when it lands (a completed transfer of another rid is stale to
    # it, on both releases), and it cannot be cancelled on 0.1.5 (404 during the KV wait):
    # it ends by itself.
    intruder = threading.Thread(
        target=httpx.post,
        args=(node.url + "/pd/decode",),
        kwargs={"json": {"rid": "intruder", "first_token_id": 1, "timeout_s": 3}, "timeout": 30},
    )
    intruder.start()
    try:
        _wait(lambda: sim_get(node.url, "/decode_status")["current_rid"] == "intruder")
        response = post_chat(gateway, {"model": "solo", "messages": user("hi")})
        assert response.status_code == 503
        assert error_of(response)["code"] == "node_busy"
        # Our transfer landed on the node: the slot stays held until the node is clean.
        assert gateway.pool()["models"]["solo"]["busy"][node.url.removeprefix("http://")]
    finally:
        plain().post(node.url + "/pd/cancel", json={"rid": "intruder"}, timeout=10)  # 404 on 0.1.5
        intruder.join()
    gateway.wait_all_free()
    decodes = sim_get(node.url, "/sim/records")["decodes"]  # the flushes included
    cleanup = [d for d in decodes if d["rid"] != "intruder" and d["status"] != 429]
    # Consumed once the node was idle, or (if it stayed busy too long) flushed by the
    # prober before readmission: either way one-token decodes only, and the node idle.
    assert cleanup and all(d["request"]["max_tokens"] == 1 for d in cleanup)
    assert_nodes_idle(stack)


# -- failures after the first byte: an error event, a clean end, the slot released ----


@pytest.mark.parametrize(
    ("fault", "needle"),
    [
        ({"die_after": 4}, "ended without its last line"),
        ({"error_after": 4}, "decode stalled"),
        ({"stall_after": 4}, "sent no line for 2 s"),
    ],
)
def test_node_failure_mid_stream(
    gateway: GatewayProcess, stack: SimStack, fault: dict, needle: str
) -> None:
    sim_post(stack.nodes[2].url, "/sim/faults", {**fault, "count": 1})
    body = {"model": "solo", "messages": user(directive(SCRIPTED)), "stream": True}
    with plain().stream("POST", gateway.base_url + "/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert needle in events[-2]
    assert '"error"' in events[-2]
    text = "".join(
        openai.types.chat.ChatCompletionChunk.model_validate_json(e[6:]).choices[0].delta.content
        or ""
        for e in events[:-2]
    )
    assert text and SCRIPTED.startswith(text)
    gateway.wait_all_free()
    assert_nodes_idle(stack)


def test_responses_stream_failing_mid_way_ends_failed_and_frees_the_node(
    client: openai.OpenAI, gateway: GatewayProcess, stack: SimStack
) -> None:
    sim_post(stack.nodes[2].url, "/sim/faults", {"die_after": 4, "count": 1})
    with client.responses.stream(model="solo", input=directive(SCRIPTED)) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-2:] == ["error", "response.failed"]
    failed = events[-1].response  # type: ignore[union-attr]
    assert failed.status == "failed" and failed.error is not None
    assert "ended without its last line" in failed.error.message
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and SCRIPTED.startswith(text)
    gateway.wait_all_free()
    assert_nodes_idle(stack)


def test_sdk_raises_on_a_mid_stream_error(client: openai.OpenAI, stack: SimStack) -> None:
    sim_post(stack.nodes[2].url, "/sim/faults", {"die_after": 4, "count": 1})
    stream = client.chat.completions.create(
        model="solo", messages=user(directive(SCRIPTED)), stream=True
    )
    with pytest.raises(openai.APIError, match="ended without its last line"):
        list(stream)


def test_node_failure_before_a_non_streamed_answer_is_an_error_response(
    gateway: GatewayProcess, stack: SimStack
) -> None:
    sim_post(stack.nodes[2].url, "/sim/faults", {"die_after": 4, "count": 1})
    response = post_chat(gateway, {"model": "solo", "messages": user(directive(SCRIPTED))})
    assert response.status_code == 502
    assert error_of(response)["code"] == "decode_truncated"


def test_client_disconnect_mid_stream_cancels_the_node(
    gateway: GatewayProcess, stack: SimStack
) -> None:
    sim_post(stack.nodes[2].url, "/sim/faults", {"stall_after": 4, "count": 1})
    body = {"model": "solo", "messages": user(directive(SCRIPTED)), "stream": True}
    with plain().stream("POST", gateway.base_url + "/chat/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        _wait(lambda: sim_get(stack.nodes[2].url, "/decode_status")["status"] == "busy")
    # the client has gone: the gateway cancels the node and frees the slot
    gateway.wait_all_free()
    assert [d["finish_reason"] for d in node_decodes(stack, 2)] == ["cancelled"]
    assert_nodes_idle(stack)


# -- bad input: a 400/404 naming the problem, nothing sent upstream --------------------


@pytest.mark.parametrize(
    ("path", "content", "status", "needle"),
    [
        ("/chat/completions", b"{not json", 400, "not valid JSON"),
        ("/chat/completions", b'["a list"]', 400, "JSON object"),
        ("/chat/completions", b'{"model": "ds"}', 400, "'messages' is required"),
        ("/completions", b'{"model": "ds"}', 400, "'prompt' is required"),
        ("/chat/completions", b'{"model": "ds", "messages": "hi"}', 400, "messages"),
        (
            "/chat/completions",
            MESSAGES[:-1] + b', "max_tokens": -5}',
            400,
            "max_tokens",
        ),
        (
            "/chat/completions",
            MESSAGES[:-1] + b', "max_tokens": 99999999999}',
            400,
            "max_tokens",
        ),
        (
            "/chat/completions",
            MESSAGES[:-1] + b', "temperature": "hot"}',
            400,
            "temperature",
        ),
        (
            "/chat/completions",
            b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}',
            404,
            "'nope' does not exist",
        ),
        ("/nowhere", b"{}", 404, "does not serve POST /v1/nowhere"),
    ],
)
def test_bad_input(
    gateway: GatewayProcess, stack: SimStack, path: str, content: bytes, status: int, needle: str
) -> None:
    response = plain().post(
        gateway.base_url + path,
        content=content,
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert response.status_code == status
    assert needle in error_of(response)["message"]
    assert prefill_requests(stack) == []
    assert all_decodes(stack) == []


def test_models_and_health(gateway: GatewayProcess) -> None:
    models = plain().get(gateway.base_url + "/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["ds", "solo", "deadprefill"]
    assert plain().get(gateway.url + "/health", timeout=10).json() == {"status": "ok"}


def _wait(condition, timeout_s: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def metric(gateway: GatewayProcess, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = plain().get(gateway.url + "/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def test_metrics_count_requests_latencies_errors_and_cancellations(
    gateway: GatewayProcess, stack: SimStack, client: openai.OpenAI
) -> None:
    ok = {"model": "ds", "endpoint": "chat", "path": "latency", "rule": "default", "status": "200"}
    before = {
        "ok": metric(gateway, "pd_gateway_requests_total", **ok),
        "ttft": metric(gateway, "pd_gateway_ttft_seconds_count", model="ds", path="latency"),
        "bad": metric(gateway, "pd_gateway_requests_total", model="solo", status="502"),
        "errors": metric(gateway, "pd_gateway_upstream_errors_total", code="decode_failed"),
        "stops": metric(gateway, "pd_gateway_cancellations_total", reason="stop_sequence"),
    }
    client.chat.completions.create(model="ds", messages=user(directive(SCRIPTED)))
    list(client.chat.completions.create(model="ds", messages=user("hi"), stream=True))
    client.chat.completions.create(
        model="ds", messages=user(directive("one two three four")), stop=["three"]
    )
    sim_post(stack.nodes[2].url, "/sim/faults", {"decode_500": True, "count": 1})
    assert post_chat(gateway, {"model": "solo", "messages": user("hi")}).status_code == 502
    gateway.wait_all_free()
    assert metric(gateway, "pd_gateway_requests_total", **ok) == before["ok"] + 3
    assert (
        metric(gateway, "pd_gateway_ttft_seconds_count", model="ds", path="latency")
        == before["ttft"] + 3
    )
    assert (
        metric(gateway, "pd_gateway_requests_total", model="solo", status="502")
        == before["bad"] + 1
    )
    assert (
        metric(gateway, "pd_gateway_upstream_errors_total", code="decode_failed")
        == before["errors"] + 1
    )
    assert (
        metric(gateway, "pd_gateway_cancellations_total", reason="stop_sequence")
        == before["stops"] + 1
    )
    assert metric(gateway, "pd_gateway_pool_slot_busy", model="ds") == 0
    assert metric(gateway, "pd_gateway_pool_node_in_service", model="ds") == 2
    assert metric(gateway, "pd_gateway_inter_token_seconds_count", model="ds", path="latency") > 0


def send_raw(gateway: GatewayProcess, body: dict) -> socket.socket:
    """A client that sends its request and will simply close its socket (no httpx in the way)."""
    host, port = gateway.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    payload = json.dumps(body).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


def test_client_leaving_a_non_streamed_request_cancels_the_node(
    gateway: GatewayProcess, stack: SimStack
) -> None:
    # Held at its start until released: only the client's leaving, or the stall timeout,
    # can end it, and the cancellation's reason says which.
    node = stack.nodes[2].url
    gone = metric(gateway, "pd_gateway_cancellations_total", model="solo", reason="client_gone")
    sim_post(node, "/sim/faults", {"hold_start": True, "count": 1})
    client = send_raw(gateway, {"model": "solo", "messages": user(directive(SCRIPTED))})
    _wait(lambda: sim_get(node, "/sim/held")["held"] == 1)
    client.close()  # the client gives up on its answer
    gateway.wait_all_free()
    assert [d["finish_reason"] for d in node_decodes(stack, 2)] == ["cancelled"]
    left = metric(gateway, "pd_gateway_cancellations_total", model="solo", reason="client_gone")
    assert left == gone + 1
    assert_nodes_idle(stack)


def test_client_leaving_the_queue_is_never_served(gateway: GatewayProcess, stack: SimStack) -> None:
    sim_post(stack.nodes[2].url, "/sim/faults", {"stall_after": 4, "count": 1})
    holder_body = {"model": "solo", "messages": user(directive(SCRIPTED)), "stream": True}
    with plain().stream(
        "POST", gateway.base_url + "/chat/completions", json=holder_body, timeout=30
    ) as holder:
        lines = holder.iter_lines()  # kept: dropping the iterator would close the connection
        next(lines)
        waiter = send_raw(gateway, {"model": "solo", "messages": user("queued")})
        _wait(lambda: gateway.pool()["models"]["solo"]["waiting"] == 1)
        waiter.close()
        _wait(lambda: gateway.pool()["models"]["solo"]["waiting"] == 0)
    gateway.wait_all_free()
    prompts = [r["body"]["messages"][0]["content"] for r in prefill_requests(stack)]
    assert prompts == [directive(SCRIPTED)], "the request that left was never prefilled"


def test_stop_reason_and_vllms_fields_as_vllm_sends_them(gateway: GatewayProcess) -> None:
    text = "one two three STOP four five"
    body = {"model": "ds", "messages": user(directive(text)), "stop": [" STOP"]}
    answer = post_chat(gateway, body).json()
    choice = answer["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("one two three", "stop")
    assert choice["stop_reason"] == " STOP"
    # The prefill server's fingerprint, as vLLM names itself.
    assert answer["system_fingerprint"].startswith("vllm-") and answer["service_tier"] is None
    plain = post_chat(gateway, {"model": "ds", "messages": user(directive("hi"))}).json()
    assert plain["choices"][0]["stop_reason"] is None, "EOS: no stop string or id"
    # A client that names a tier is told the one that served it: a node is `priority`.
    tiered = {"model": "ds", "messages": user(directive("hi")), "service_tier": "auto"}
    assert post_chat(gateway, tiered).json()["service_tier"] == "priority"
    # So is every chunk of its stream (vLLM's chunks have no such field).
    streamed = post_chat(gateway, {**tiered, "stream": True}).text
    chunks = [
        orjson.loads(line[6:]) for line in streamed.splitlines() if line.startswith("data: {")
    ]
    assert chunks and all(chunk["service_tier"] == "priority" for chunk in chunks)
    plain_stream = post_chat(gateway, {**tiered, "service_tier": None, "stream": True}).text
    assert '"service_tier"' not in plain_stream


def test_continuous_usage_stats_puts_the_running_count_on_every_chunk(
    gateway: GatewayProcess,
) -> None:
    body = {
        "model": "ds",
        "messages": user(directive(" ".join(f"w{i}" for i in range(20)))),
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    chunks = []
    with plain().stream("POST", gateway.base_url + "/chat/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line.removeprefix("data: ")))
    counted = [c["usage"]["completion_tokens"] for c in chunks if c["choices"] and "usage" in c]
    content_chunks = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert content_chunks and all("usage" in c for c in content_chunks)
    assert counted == sorted(counted) and counted[-1] == chunks[-1]["usage"]["completion_tokens"]
