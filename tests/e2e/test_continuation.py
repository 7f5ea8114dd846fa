"""An answer whose TileRT node fails mid-stream goes on from another node, unseen: the
real OpenAI SDK -> the gateway (a real process) -> simulated prefill servers and nodes
(real processes) whose model continues a context greedily, so the continued answer is
held to an uninterrupted one, token for token.

The prefill that continues names the prompt and the output so far as token ids (the first
prefill gave the prompt's ids, `return_token_ids`), with what is left of the budget; the
client sees one answer, one finish and the whole answer's usage.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from sim.stack import SimStack
from tests.support.deployment import (
    directive,
    latency_model,
    request_decodes,
    sim_get,
    sim_post,
)
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.http import plain
from tests.support.stacks import StackPool, latency_stack

pytestmark = pytest.mark.usefixtures("fresh_sims", "all_slots_free")

SCRIPTED = "Hello, wörld! 你好世界 🌍🚀 — naïve café. Done, and then some more words."
FAULTS = [{"die_after": 4}, {"error_after": 4}, {"stall_after": 4}]
FAULT_IDS = ["died", "error_line", "stalled"]


@pytest.fixture(scope="module")
def stack(tilert_version: str, sim_stacks: StackPool) -> SimStack:
    return latency_stack(sim_stacks, tilert_version)


@pytest.fixture(scope="module")
def gateway(
    stack: SimStack, tilert_version: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    v = tilert_version
    one = latency_model(stack, "ds", nodes=stack.nodes[2:3], output_parser="deepseek_v32", tilert=v)
    two = latency_model(stack, "solo", nodes=stack.nodes[:2], tilert=v)
    admin = {"api_key": "sk-admin"}
    with start_gateway(tmp_path_factory, [one, two], admin=admin) as running:
        yield running


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def decodes(stack: SimStack, index: int) -> list[dict[str, Any]]:
    return request_decodes(sim_get(stack.nodes[index].url, "/sim/records")["decodes"])


def prefills(stack: SimStack) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = sim_get(stack.prefills[0].url, "/sim/requests")["requests"]
    return requests


def streamed(client: openai.OpenAI, **body: Any) -> tuple[str, list[Any]]:
    chunks = list(
        client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **body)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not in time: {what}"
        time.sleep(0.02)


@pytest.mark.parametrize("fault", FAULTS, ids=FAULT_IDS)
def test_a_stream_whose_node_fails_goes_on_as_if_it_had_not(
    client: openai.OpenAI, gateway: GatewayProcess, stack: SimStack, fault: dict[str, int]
) -> None:
    messages = user(directive(SCRIPTED))
    whole = client.chat.completions.create(model="ds", messages=messages)
    sim_post(stack.nodes[2].url, "/sim/faults", {**fault, "count": 1})
    text, chunks = streamed(client, model="ds", messages=messages)
    assert text == SCRIPTED == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1].usage == whole.usage  # the prompt is the client's, not the continuation's
    # Two decodes for the streamed answer: the one that broke, and the one that went on.
    broke, went_on = decodes(stack, 2)[1:]
    assert broke["finish_reason"] != "stop" and went_on["finish_reason"] == "stop"
    first, continuing = prefills(stack)[1:]
    ids = continuing["body"]["kv_transfer_params"]["prompt_token_ids"]
    assert len(ids) > whole.usage.prompt_tokens  # the prompt and the output so far
    assert first["body"]["return_token_ids"] is True
    gateway.wait_all_free()
    metrics = plain().get(gateway.url + "/metrics", timeout=10).text
    assert any(
        line.startswith("pd_gateway_continuations_total{")
        and 'model="ds"' in line
        and 'outcome="continued"' in line
        and float(line.rsplit(" ", 1)[1]) >= 1
        for line in metrics.splitlines()
    )


@pytest.mark.parametrize("fault", FAULTS[:1], ids=FAULT_IDS[:1])
def test_an_answer_not_streamed_is_continued_too(
    client: openai.OpenAI, stack: SimStack, fault: dict[str, int]
) -> None:
    prompt = "say something of your own"  # filler: the model's own greedy answer
    whole = client.completions.create(model="ds", prompt=prompt, max_tokens=200)
    sim_post(stack.nodes[2].url, "/sim/faults", {**fault, "count": 1})
    again = client.completions.create(model="ds", prompt=prompt, max_tokens=200)
    assert again.choices[0].text == whole.choices[0].text
    assert again.choices[0].finish_reason == whole.choices[0].finish_reason
    assert again.usage == whole.usage
    assert len(decodes(stack, 2)) == 3


def test_a_stop_string_across_the_seam_is_found(client: openai.OpenAI, stack: SimStack) -> None:
    # The node breaks after 4 lines: the stop string starts in them and ends after them.
    whole = client.chat.completions.create(model="ds", messages=user(directive(SCRIPTED)))
    assert whole.choices[0].message.content == SCRIPTED
    sim_post(stack.nodes[2].url, "/sim/faults", {"die_after": 3, "count": 1})
    reply = client.chat.completions.create(
        model="ds", messages=user(directive(SCRIPTED)), stop=["wörld! 你好"]
    )
    assert reply.choices[0].message.content == "Hello, "
    assert reply.choices[0].finish_reason == "stop"
    assert len(decodes(stack, 2)) == 3


def test_a_seam_inside_a_tool_calls_arguments_is_invisible(
    client: openai.OpenAI, stack: SimStack
) -> None:
    call = (
        'Checking.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">San Francisco, California'
        "</｜DSML｜parameter>\n"
        "</｜DSML｜invoke>\n</｜DSML｜function_calls>"
    )
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    body: dict[str, Any] = {"model": "ds", "messages": user(directive(call)), "tools": tools}
    whole = client.chat.completions.create(**body)
    assert whole.choices[0].message.tool_calls
    sim_post(stack.nodes[2].url, "/sim/faults", {"die_after": 24, "count": 1})
    again = client.chat.completions.create(**body)
    assert again.choices[0].message.content == whole.choices[0].message.content
    got, want = again.choices[0].message.tool_calls, whole.choices[0].message.tool_calls
    assert got and want and [c.function for c in got] == [c.function for c in want]
    assert again.choices[0].finish_reason == "tool_calls"
    assert len(decodes(stack, 2)) == 3


def drain(gateway: GatewayProcess, node: str, *, drained: bool) -> None:
    verb = "drain" if drained else "undrain"
    url = f"{gateway.url}/admin/nodes/{node}/{verb}"
    plain().post(url, headers=gateway.admin_headers, timeout=10).raise_for_status()


def node_id(stack: SimStack, index: int) -> str:
    node = stack.nodes[index]
    return f"127.0.0.1:{node.http_port}"


def test_the_answer_goes_on_on_another_node_of_the_pool(
    client: openai.OpenAI, gateway: GatewayProcess, stack: SimStack
) -> None:
    """Node 0 takes the request and stalls; meanwhile node 1 is the only one taking new
    requests: the answer goes on there."""
    messages = user(directive(SCRIPTED))
    drain(gateway, node_id(stack, 1), drained=True)
    sim_post(stack.nodes[0].url, "/sim/faults", {"stall_after": 4, "count": 1})
    stream = client.chat.completions.create(model="solo", messages=messages, stream=True)
    chunks = [next(stream)]
    drain(gateway, node_id(stack, 1), drained=False)
    drain(gateway, node_id(stack, 0), drained=True)
    chunks += list(stream)
    drain(gateway, node_id(stack, 0), drained=False)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == SCRIPTED
    assert [d["finish_reason"] for d in decodes(stack, 0)] == ["cancelled"]
    assert [d["finish_reason"] for d in decodes(stack, 1)] == ["stop"]


def test_past_its_continuations_an_answer_ends_with_an_error_event(
    client: openai.OpenAI, gateway: GatewayProcess, stack: SimStack
) -> None:
    messages = user(directive(SCRIPTED))
    drain(gateway, node_id(stack, 1), drained=True)
    sim_post(stack.nodes[0].url, "/sim/faults", {"stall_after": 4, "count": 1})
    stream = client.chat.completions.create(model="solo", messages=messages, stream=True)
    chunks = [next(stream)]
    sim_post(stack.nodes[1].url, "/sim/faults", {"die_after": 2, "count": 1})
    drain(gateway, node_id(stack, 1), drained=False)
    drain(gateway, node_id(stack, 0), drained=True)
    with pytest.raises(openai.APIError, match="ended without its last line"):
        chunks += list(stream)
    drain(gateway, node_id(stack, 0), drained=False)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert SCRIPTED.startswith(text)
    until(lambda: len(decodes(stack, 1)) == 1, "the second node's decode recorded")


@pytest.fixture(scope="module")
def native_stack(sim_stacks: StackPool) -> SimStack:
    """The native path of `both` below: one vLLM server serving whole (standing in for a
    disaggregation proxy), whose model continues a context as the nodes' does."""
    return sim_stacks.get(nodes=0, prefills=0, proxy=True, model="ds", proxy_args=["--itl-ms", "0"])


@pytest.fixture(scope="module")
def both(
    stack: SimStack,
    native_stack: SimStack,
    tilert_version: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    """`ds` on a pool of node 3 alone, with a native path: a continuation that finds no
    node free within its wait goes on there."""
    assert native_stack.proxy is not None
    model = latency_model(
        stack,
        "ds",
        nodes=stack.nodes[3:4],
        output_parser="deepseek_v32",
        tilert=tilert_version,
        throughput={"mode": "proxy", "urls": [native_stack.proxy.url]},
    )
    model["latency"]["continuation_wait_ms"] = 200
    with start_gateway(tmp_path_factory, [model], admin={"api_key": "sk-admin"}) as running:
        yield running


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_with_no_node_free_the_answer_goes_on_on_the_native_path(
    both: GatewayProcess, stack: SimStack, native_stack: SimStack, stream: bool
) -> None:
    """Node 3 stalls mid-answer and is drained meanwhile: the rest comes from the native
    path's server, the prompt and the output so far sent as token ids, and the client sees
    the answer it would have had."""
    assert native_stack.proxy is not None
    native = native_stack.proxy.url
    sim_post(native, "/sim/reset")
    client = openai.OpenAI(base_url=both.base_url, api_key="unused", max_retries=0, timeout=60)
    messages = user(directive(SCRIPTED))
    whole = client.chat.completions.create(model="ds", messages=messages)
    assert sim_get(native, "/sim/requests")["requests"] == []  # served by the node
    node = node_id(stack, 3)
    sim_post(stack.nodes[3].url, "/sim/faults", {"stall_after": 4, "count": 1})
    if stream:
        chunks_stream = client.chat.completions.create(
            model="ds", messages=messages, stream=True, stream_options={"include_usage": True}
        )
        chunks = [next(chunks_stream)]
        drain(both, node, drained=True)
        chunks += list(chunks_stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
        usage = chunks[-1].usage
    else:
        answers: list[Any] = []
        asking = threading.Thread(
            target=lambda: answers.append(
                client.chat.completions.create(model="ds", messages=messages)
            )
        )
        asking.start()
        # Drained once its decode has started, well before its stall is found (2 s).
        until(lambda: len(decodes(stack, 3)) == 2, "the second decode started")
        drain(both, node, drained=True)
        asking.join(timeout=60)
        (again,) = answers
        text, usage = again.choices[0].message.content, again.usage
        assert again.choices[0].finish_reason == "stop"
    drain(both, node, drained=False)
    client.close()
    assert text == SCRIPTED == whole.choices[0].message.content
    assert usage == whole.usage  # the prompt is the client's, and the EOS counted once
    (continued,) = sim_get(native, "/sim/requests")["requests"]
    body = continued["body"]
    assert body["stream"] is True and body["return_token_ids"] is True
    assert len(body["prompt"]) > whole.usage.prompt_tokens  # the prompt and the output so far
    both.wait_all_free()
    metrics = plain().get(both.url + "/metrics", timeout=10).text
    assert any(
        line.startswith("pd_gateway_continuations_total{")
        and 'outcome="continued_native"' in line
        and float(line.rsplit(" ", 1)[1]) >= 1
        for line in metrics.splitlines()
    )
