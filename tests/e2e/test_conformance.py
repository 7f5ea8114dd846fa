"""Conformance: for the same model output, a client cannot tell which path answered, except
by the `x-pd-*` headers. The same scripted outputs go through the latency path and vLLM's
native path (simulated vLLM with the reasoning and tool-call parsers of the model's
`output_parser`), and the two answers are compared field by field, ids and times masked:
whole responses, and streams (every chunk's shape and the reassembled message).

Known differences are listed in the README ("Conformance") with their reason; this module
asserts there is no other. Fields the simulator does not send as vLLM 0.32 does (UNSIMULATED)
are left out on both sides: tests/real_vllm/test_latency_shapes.py holds the gateway's
answers against a real vLLM's instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from demo.plan import parser_flags
from sim.stack import SimStack
from tests.support.deployment import directive, latency_model
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.stacks import StackPool

pytestmark = pytest.mark.usefixtures("all_slots_free")

MODEL = "ds"
CLASSIFICATION = {
    "rules": {
        "default": {"name": "conformance", "path": "latency"},
        "rules": [
            {"name": "native", "match": {"headers": {"x-path": "native"}}, "path": "throughput"}
        ],
    }
}
NATIVE = {"x-path": "native"}
FAST = ["--itl-ms", "0", "--prefill-ms-per-token", "0"]
MASKED = {"id", "created", "tool_call_id"}
# vLLM 0.32's fields the simulated vLLM leaves out, sends under an older name
# (`reasoning_content`) or fills differently (usage details, Responses' sampling echo).
UNSIMULATED = frozenset(
    {
        "reasoning_content",
        "token_ids",
        "routed_experts",
        "prompt_token_ids",
        "prompt_text",
        "ec_transfer_params",
        "metrics",
        "prompt_tokens_details",
        "completion_tokens_details",
    }
)

TEXT = "Plain prose with café, naïve and 速度 — then an emoji 🌍 and the end."
# Each emoji is two tokens: a budget of CUT_AT ends inside the third.
CUT_TEXT, CUT_AT = "😀" * 6, 5
CASES: dict[str, dict[str, Any]] = {
    "plain": {"messages": [{"role": "user", "content": directive(TEXT)}]},
    "stop string": {
        "messages": [{"role": "user", "content": directive("one two three STOP four five")}],
        "stop": [" STOP"],
    },
    "stop token id": {
        "messages": [{"role": "user", "content": directive("alpha beta gamma delta")}],
        "stop_token_ids": [],  # filled in by the fixture: the id of " gamma"
    },
    "length cut in a character": {
        "messages": [{"role": "user", "content": directive(CUT_TEXT)}],
        "max_tokens": CUT_AT,
    },
    "usage in the stream": {
        "messages": [{"role": "user", "content": directive(TEXT)}],
        "stream_options": {"include_usage": True},
    },
    "usage on every chunk": {
        "messages": [{"role": "user", "content": directive(TEXT)}],
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    },
    "continuous usage without include_usage": {
        "messages": [{"role": "user", "content": directive(TEXT)}],
        "stream_options": {"continuous_usage_stats": True},
    },
    "reasoning and a tool call": {
        "messages": [
            {
                "role": "user",
                "content": directive(
                    "Look it up.</think>"
                    "<｜DSML｜function_calls>\n"
                    '<｜DSML｜invoke name="get_weather">\n'
                    '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
                    "</｜DSML｜invoke>\n"
                    "</｜DSML｜function_calls>"
                ),
            }
        ],
        "chat_template_kwargs": {"thinking": True},
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                },
            }
        ],
    },
}


COMPLETIONS: dict[str, dict[str, Any]] = {
    "plain": {"prompt": directive(TEXT)},
    "stop string": {"prompt": directive("one two three STOP four five"), "stop": " STOP"},
    "length cut in a character": {"prompt": directive(CUT_TEXT), "max_tokens": CUT_AT},
    "usage in the stream": {
        "prompt": directive(TEXT),
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    },
}


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=1,
        prefills=1,
        decodes=1,
        tokenizer="deepseek",
        model=MODEL,
        node_args=["--step-ms", "1"],
        prefill_args=FAST,
        decode_args=FAST,
        instance_args={"decode-0": parser_flags("deepseek_v32")},
    )


@pytest.fixture(scope="module")
def gateway(stack: SimStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    throughput = {
        "mode": "pull",
        "prefill": [stack.prefills[0].url],
        "decode": [stack.decodes[0].url],
    }
    model = latency_model(stack, MODEL, output_parser="deepseek_v32", throughput=throughput)
    with start_gateway(tmp_path_factory, [model], classification=CLASSIFICATION) as running:
        yield running


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as client:
        yield client


def request(name: str, *, stream: bool) -> dict[str, Any]:
    body = {"model": MODEL, "max_tokens": 256, **CASES[name], "stream": stream}
    if name == "stop token id":
        from tests.support.parser_fixtures import load_tokenizer

        ids = load_tokenizer("deepseek").encode(" gamma", add_special_tokens=False).ids
        body["stop_token_ids"] = ids[:1]
    if not stream:
        body.pop("stream_options", None)
    return body


def masked(value: Any) -> Any:
    """`value` with the fields that differ by nature (ids, times) replaced by their type, and
    without the UNSIMULATED ones (an empty `tool_calls` list is vLLM's absent one)."""
    if isinstance(value, dict):
        return {
            k: type(v).__name__ if k in MASKED else masked(v)
            for k, v in value.items()
            if k not in UNSIMULATED and not (k == "tool_calls" and v == [])
        }
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


def whole(http: httpx.Client, gateway: GatewayProcess, name: str, native: bool) -> Any:
    return answer(http, gateway, "/chat/completions", request(name, stream=False), native)


def completion(name: str, *, stream: bool) -> dict[str, Any]:
    body = {"model": MODEL, "max_tokens": 256, **COMPLETIONS[name], "stream": stream}
    if not stream:
        body.pop("stream_options", None)
    return body


def answer(
    http: httpx.Client, gateway: GatewayProcess, path: str, body: dict[str, Any], native: bool
) -> Any:
    headers = NATIVE if native else {}
    response = http.post(gateway.base_url + path, json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["x-pd-route"] == ("throughput" if native else "latency")
    return masked(response.json())


def chunks(http: httpx.Client, gateway: GatewayProcess, name: str, native: bool) -> list[Any]:
    return streamed(http, gateway, "/chat/completions", request(name, stream=True), native)


def streamed(
    http: httpx.Client, gateway: GatewayProcess, path: str, body: dict[str, Any], native: bool
) -> list[Any]:
    headers = NATIVE if native else {}
    events = []
    with http.stream("POST", gateway.base_url + path, json=body, headers=headers) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
    assert events[-1] == "[DONE]"
    return [masked(json.loads(e)) for e in events[:-1]]


def message_of(events: list[Any]) -> dict[str, Any]:
    """The streamed message reassembled: text fields concatenated, the last finish kept."""
    out: dict[str, Any] = {"content": "", "reasoning": "", "tool_calls": {}}
    for event in events:
        for choice in event["choices"]:
            delta = choice["delta"]
            out["content"] += delta.get("content") or ""
            out["reasoning"] += delta.get("reasoning") or ""
            for part in delta.get("tool_calls") or []:
                call = out["tool_calls"].setdefault(part["index"], {"name": "", "arguments": ""})
                function = part.get("function") or {}
                call["name"] += function.get("name") or ""
                call["arguments"] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                out["finish_reason"] = choice["finish_reason"]
                out["stop_reason"] = choice.get("stop_reason")
        if event.get("usage"):
            out["usage"] = event["usage"]
    return out


def shapes(events: list[Any]) -> list[tuple[str, ...]]:
    """What the chunks carry, in order: each chunk's keys, then one entry per kind of
    delta it holds (reasoning before content before tool calls, as tokens come) — the
    stream's shape without the way its tokens happen to be batched into chunks. A
    documented difference is left out: vLLM puts the last text on the chunk with
    `finish_reason`, the latency path sends the finish in a chunk of its own (it cannot know
    a chunk is the last without holding it back)."""
    out: list[tuple[str, ...]] = []
    for event in events:
        keys = sorted(k for k in event if k != "choices")
        for choice in event["choices"]:
            keys += sorted(f"choice.{k}" for k in choice if k != "delta" and choice[k] is not None)
            delta = choice.get("delta", {})
            kinds = [kind for kind, fields in DELTA_KINDS if any(delta.get(f) for f in fields)]
            if choice.get("finish_reason") is not None or not kinds:
                out.append(tuple(keys))
                continue
            out.extend((*keys, f"delta.{kind}") for kind in kinds)
        if not event["choices"]:
            out.append(tuple(keys))
    return out


DELTA_KINDS = (
    ("role", ("role",)),
    ("reasoning", ("reasoning",)),
    ("content", ("content",)),
    ("tool_calls", ("tool_calls",)),
)


def differences(latency: Any, native: Any, path: str = "") -> list[str]:
    """Where two JSON values differ: `path: latency value != native value`."""
    if isinstance(latency, dict) and isinstance(native, dict):
        missing = "(absent)"
        return [
            d
            for k in sorted(set(latency) | set(native))
            for d in differences(latency.get(k, missing), native.get(k, missing), f"{path}.{k}")
        ]
    if isinstance(latency, list) and isinstance(native, list) and len(latency) == len(native):
        return [
            d
            for i, (a, b) in enumerate(zip(latency, native, strict=True))
            for d in differences(a, b, f"{path}[{i}]")
        ]
    return [] if latency == native else [f"{path}: {latency!r} != {native!r}"]


def test_the_length_cut_ends_inside_a_character() -> None:
    from tests.support.parser_fixtures import load_tokenizer

    tokenizer = load_tokenizer("deepseek")
    ids = tokenizer.encode(CUT_TEXT, add_special_tokens=False).ids
    assert tokenizer.decode(ids[:CUT_AT]).endswith("\ufffd")


@pytest.mark.parametrize("name", list(CASES))
def test_whole_answers_are_the_same(http: httpx.Client, gateway: GatewayProcess, name: str) -> None:
    latency = whole(http, gateway, name, native=False)
    native = whole(http, gateway, name, native=True)
    assert differences(latency, native) == []


@pytest.mark.parametrize("name", list(CASES))
def test_streams_carry_the_same(http: httpx.Client, gateway: GatewayProcess, name: str) -> None:
    latency, native = chunks(http, gateway, name, False), chunks(http, gateway, name, True)
    assert differences(message_of(latency), message_of(native)) == []
    # Chunks are cut where each side's tokens fall; what kinds of chunk come, in which
    # order, is the same once runs of text chunks are merged.
    assert _runs(shapes(latency)) == _runs(shapes(native))


def _runs(items: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for item in items:
        if not out or out[-1] != item:
            out.append(item)
    return out


@pytest.mark.parametrize("name", list(COMPLETIONS))
def test_completions_are_the_same(http: httpx.Client, gateway: GatewayProcess, name: str) -> None:
    body = completion(name, stream=False)
    latency = answer(http, gateway, "/completions", body, native=False)
    native = answer(http, gateway, "/completions", body, native=True)
    assert differences(latency, native) == []


@pytest.mark.parametrize("name", list(COMPLETIONS))
def test_completion_streams_carry_the_same(
    http: httpx.Client, gateway: GatewayProcess, name: str
) -> None:
    body = completion(name, stream=True)
    streams = [streamed(http, gateway, "/completions", body, native) for native in (False, True)]
    texts = ["".join(c["text"] for e in s for c in e["choices"]) for s in streams]
    assert texts[0] == texts[1]
    usages = [[e.get("usage") for e in s if not e["choices"]] for s in streams]
    assert usages[0] == usages[1]
    # With continuous_usage_stats, every chunk carries the running count, ending at the total.
    counted = [{"usage" in e for e in s if e["choices"]} for s in streams]
    assert counted[0] == counted[1]
    running = [[e["usage"]["completion_tokens"] for e in s if e.get("usage")] for s in streams]
    assert running[0][-1:] == running[1][-1:]
    assert all(r == sorted(r) for r in running)
    finishes = [
        [c["finish_reason"] for e in s for c in e["choices"] if c["finish_reason"]] for s in streams
    ]
    assert finishes[0] == finishes[1]


# The Responses API: translated to chat on the latency path, vLLM's own on the native path.

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
TOOL_CALL_TEXT = CASES["reasoning and a tool call"]["messages"][0]["content"]
RESPONSES: dict[str, dict[str, Any]] = {
    "plain": {"input": directive(TEXT)},
    "instructions and message items": {
        "instructions": "Answer briefly.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": directive(TEXT)}]},
        ],
    },
    "length cut in a character": {"input": directive(CUT_TEXT), "max_output_tokens": CUT_AT},
    "reasoning and a tool call": {
        "input": TOOL_CALL_TEXT,
        "tools": [WEATHER_TOOL],
        "chat_template_kwargs": {"thinking": True},
    },
    "a function's output": {
        "input": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": directive(TEXT)},
        ],
        "tools": [WEATHER_TOOL],
    },
}
RESPONSES_MASKED = MASKED | {"created_at", "call_id", "item_id"}
# The Responses fields the simulated vLLM leaves out or fills otherwise than vLLM 0.32 (the
# sampling it reports, `tool_choice` without tools, `text`, the usage's per-turn counts, the
# SDK's null fields of each item); a reasoning item's `status` and a text part's `logprobs`
# when none were asked for differ too (vLLM: null).
RESPONSES_UNSIMULATED = UNSIMULATED | {
    "error",
    "store",
    "text",
    "tool_choice",
    "temperature",
    "top_p",
    "prompt",
    "presence_penalty",
    "frequency_penalty",
    "max_tool_calls",
    "kv_transfer_params",
    "input_messages",
    "output_messages",
    "input_tokens_per_turn",
    "cached_tokens_per_turn",
    "output_tokens_per_turn",
    "tool_output_tokens",
    "tool_output_tokens_per_turn",
    "phase",
    "async",
    "caller",
    "namespace",
    "created_by",
}


def responses_body(name: str, *, stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "max_output_tokens": 256, **RESPONSES[name], "stream": stream}


def masked_response(value: Any) -> Any:
    if isinstance(value, dict):
        unsimulated = RESPONSES_UNSIMULATED
        if value.get("type") == "reasoning":
            unsimulated = unsimulated | {"status"}
        elif value.get("type") == "output_text":
            unsimulated = unsimulated | {"logprobs"}
        return {
            k: type(v).__name__ if k in RESPONSES_MASKED else masked_response(v)
            for k, v in value.items()
            if k not in unsimulated
        }
    if isinstance(value, list):
        return [masked_response(v) for v in value]
    return value


def response_events(
    http: httpx.Client, gateway: GatewayProcess, body: dict[str, Any], native: bool
) -> list[dict[str, Any]]:
    """The stream's events (each `event:` line checked against its data's type)."""
    events = []
    headers = NATIVE if native else {}
    url = gateway.base_url + "/responses"
    with http.stream("POST", url, json=body, headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["x-pd-route"] == ("throughput" if native else "latency")
        kind = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: ") :]
            elif line.startswith("data: "):
                event = json.loads(line[len("data: ") :])
                assert event["type"] == kind
                events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def event_kinds(events: list[dict[str, Any]]) -> list[str]:
    """The event types in order, runs of deltas merged (tokens are batched differently). A
    cut stream ends with `response.completed` in vLLM 0.32, `response.incomplete` in the
    simulator: the same here (the status inside is compared with the final response)."""
    out: list[str] = []
    for event in events:
        kind = event["type"].replace("response.incomplete", "response.completed")
        if not (kind.endswith(".delta") and out and out[-1] == kind):
            out.append(kind)
    return out


@pytest.mark.parametrize("name", list(RESPONSES))
def test_responses_are_the_same(http: httpx.Client, gateway: GatewayProcess, name: str) -> None:
    body = responses_body(name, stream=False)
    latency = answer(http, gateway, "/responses", body, native=False)
    native = answer(http, gateway, "/responses", body, native=True)
    assert latency["object"] == "response" and latency["output"]
    assert differences(masked_response(latency), masked_response(native)) == []


@pytest.mark.parametrize("name", list(RESPONSES))
def test_response_streams_carry_the_same(
    http: httpx.Client, gateway: GatewayProcess, name: str
) -> None:
    body = responses_body(name, stream=True)
    latency, native = (response_events(http, gateway, body, n) for n in (False, True))
    assert event_kinds(latency) == event_kinds(native)
    finals = [masked_response(events[-1]["response"]) for events in (latency, native)]
    assert differences(finals[0], finals[1]) == []
    # The final response is what the deltas built.
    text = "".join(e["delta"] for e in latency if e["type"] == "response.output_text.delta")
    final_text = "".join(
        part["text"]
        for item in latency[-1]["response"]["output"]
        if item["type"] == "message"
        for part in item["content"]
    )
    assert text == final_text


@pytest.mark.parametrize("native", [False, True], ids=["latency", "native"])
def test_sdk_responses_create(client: openai.OpenAI, native: bool) -> None:
    headers = NATIVE if native else {}
    raw = client.responses.with_raw_response.create(
        model=MODEL, input=directive(TEXT), extra_headers=headers
    )
    assert raw.headers["x-pd-route"] == ("throughput" if native else "latency")
    response = raw.parse()
    assert response.status == "completed"
    assert response.output_text == TEXT
    assert response.usage is not None and response.usage.output_tokens > 0


@pytest.mark.parametrize("native", [False, True], ids=["latency", "native"])
def test_sdk_responses_stream_with_a_function_tool(client: openai.OpenAI, native: bool) -> None:
    headers = NATIVE if native else {}
    with client.responses.stream(
        model=MODEL,
        input=TOOL_CALL_TEXT,
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        extra_body={"chat_template_kwargs": {"thinking": True}},
        extra_headers=headers,
    ) as stream:
        arguments = "".join(
            event.delta
            for event in stream
            if event.type == "response.function_call_arguments.delta"
        )
        final = stream.get_final_response()
    calls = [item for item in final.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert arguments == calls[0].arguments
    reasoning = [item for item in final.output if item.type == "reasoning"]
    assert [part.text for part in reasoning[0].content or []] == ["Look it up."]


def test_stateful_responses_go_to_the_native_path(
    http: httpx.Client, gateway: GatewayProcess
) -> None:
    # vLLM holds no response `resp_1`, so it answers 404: its answer, relayed.
    cases = [({"previous_response_id": "resp_1"}, 404), ({"store": True}, 200)]
    for extra, status in [*cases, ({"background": True}, 200)]:
        body = {"model": MODEL, "input": directive(TEXT), **extra}
        response = http.post(gateway.base_url + "/responses", json=body)
        assert response.status_code == status, response.text
        assert response.headers["x-pd-route"] == "throughput"
        assert response.headers["x-pd-reroute-reason"] == next(iter(extra))
