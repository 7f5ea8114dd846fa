"""A script of requests sent alike to real vLLM and to the vLLM simulator, and the
normalisation that leaves only what must not differ between them.

Generated text, ids, times and logprob values differ (vLLM's model has random weights);
statuses, key sets and order, types, token counts, chunk counts and where the finish
lands must not. Lengths are pinned with ``max_tokens`` and ``ignore_eos`` so that both
emit exactly N tokens; Responses streams run greedy (``temperature: 0``) on prompts where
every token of vLLM's output carries text, as a delta event is sent per non-empty text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import orjson

HI = [{"role": "user", "content": "hi"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
PINNED = {"ignore_eos": True}


@dataclass(frozen=True)
class Case:
    """One request: raw HTTP (``body`` as JSON, or ``raw`` bytes) or through the SDK."""

    name: str
    path: str = "/v1/chat/completions"
    body: dict[str, Any] | list[Any] | None = None
    raw: bytes | None = None
    content_type: str = "application/json"
    method: str = "POST"
    sdk: bool = False
    exact_param: bool = True
    """False where vLLM's error ``param`` names its own pydantic union members."""
    headers: dict[str, str] = field(default_factory=dict)


def chat(name: str, **body: Any) -> Case:
    return Case(name, body={"messages": HI, **body})


def completion(name: str, **body: Any) -> Case:
    return Case(name, "/v1/completions", body={"prompt": "hi there", **body})


def responses(name: str, **body: Any) -> Case:
    return Case(name, "/v1/responses", body={"input": "hi", **body})


CASES: list[Case] = [
    # chat, whole and streamed
    chat("chat", max_tokens=3, **PINNED),
    chat("chat_default_fields", max_tokens=1),
    Case(
        "chat_conversation",
        body={
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": "Sunny."},
                {"role": "user", "content": [{"type": "text", "text": "And in Zürich?"}]},
            ],
            "max_tokens": 2,
            **PINNED,
        },
    ),
    Case(
        "chat_tool_history",
        body={
            "messages": [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
            "tools": [WEATHER_TOOL],
            "tool_choice": "none",
            "max_tokens": 2,
            **PINNED,
        },
    ),
    chat("chat_tools_none", tools=[WEATHER_TOOL], tool_choice="none", max_tokens=1),
    chat("chat_max_completion_tokens", max_completion_tokens=2, **PINNED),
    chat("chat_n2", n=2, max_tokens=2, **PINNED),
    chat("chat_logprobs", logprobs=True, top_logprobs=2, max_tokens=2, **PINNED),
    chat("chat_logprobs_no_top", logprobs=True, max_tokens=2, **PINNED),
    chat("chat_top_logprobs_zero", logprobs=True, top_logprobs=0, max_tokens=2, **PINNED),
    chat(
        "chat_stream_n3_continuous_usage",
        stream=True,
        n=3,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        max_tokens=2,
        **PINNED,
    ),
    chat("chat_stop_unmatched", stop=["\u2603\u2603\u2603"], max_tokens=3, **PINNED),
    chat("chat_stream", stream=True, max_tokens=3, **PINNED),
    chat(
        "chat_stream_usage",
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=3,
        **PINNED,
    ),
    chat(
        "chat_stream_continuous_usage",
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        logprobs=True,
        max_tokens=2,
        **PINNED,
    ),
    chat("chat_stream_n2", stream=True, n=2, max_tokens=2, **PINNED),
    chat(
        "chat_stream_n2_usage",
        stream=True,
        n=2,
        stream_options={"include_usage": True},
        max_tokens=2,
        **PINNED,
    ),
    chat(
        "chat_stream_logprobs", stream=True, logprobs=True, top_logprobs=1, max_tokens=2, **PINNED
    ),
    # chat, refused
    chat("chat_max_tokens_over_context", max_tokens=5000),
    chat("chat_max_tokens_zero", max_tokens=0),
    chat("chat_n0", n=0),
    chat("chat_top_p0", top_p=0),
    chat("chat_temperature_above_2", temperature=2.5),
    chat("chat_top_k_negative", top_k=-5),
    chat("chat_top_k_off", top_k=-1, max_tokens=1),
    chat("chat_min_p_above_1", min_p=2),
    chat("chat_presence_penalty_out_of_range", presence_penalty=5),
    chat("chat_repetition_penalty_zero", repetition_penalty=0),
    chat("chat_greedy_n2", temperature=0, n=2),
    chat("chat_stream_options_without_stream", stream_options={"include_usage": True}),
    chat("chat_temperature_negative", temperature=-1),
    chat("chat_top_logprobs_without_logprobs", top_logprobs=2),
    chat("chat_top_logprobs_30", logprobs=True, top_logprobs=30),
    Case(
        "chat_integer_content",
        body={"messages": [{"role": "user", "content": 5}]},
        exact_param=False,
    ),
    chat("chat_bad_tool_type", tools=[{"type": "bogus", "function": {"name": "f"}}]),
    chat("chat_tools_auto", tools=[WEATHER_TOOL]),
    chat("chat_tools_required", tools=[WEATHER_TOOL], tool_choice="required"),
    chat(
        "chat_tools_named",
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    ),
    chat("chat_unknown_model", model="nope"),
    chat("chat_stream_refused", stream=True, n=0),
    Case("chat_empty_messages", body={"messages": []}),
    Case("chat_missing_messages", body={}),
    Case("chat_not_json", raw=b"not json"),
    Case("chat_list_body", body=[1]),
    Case(
        "chat_text_plain",
        raw=orjson.dumps({"messages": HI}),
        content_type="text/plain",
    ),
    Case("chat_prompt_too_long", body={"messages": [{"role": "user", "content": "hi " * 2100}]}),
    # completions
    completion("completion", max_tokens=3, **PINNED),
    completion("completion_default_max_tokens", **PINNED),
    completion("completion_logprobs", logprobs=2, max_tokens=2, **PINNED),
    completion("completion_echo", echo=True, max_tokens=2, **PINNED),
    completion("completion_echo_logprobs", echo=True, logprobs=1, max_tokens=2, **PINNED),
    completion("completion_echo_only", echo=True, logprobs=1, max_tokens=0),
    completion("completion_n2", n=2, max_tokens=2, **PINNED),
    Case(
        "completion_two_prompts",
        "/v1/completions",
        body={"prompt": ["hi", "yo"], "max_tokens": 1, **PINNED},
    ),
    Case(
        "completion_token_ids",
        "/v1/completions",
        body={"prompt": [5, 6, 7], "max_tokens": 2, **PINNED},
    ),
    completion("completion_stream", stream=True, max_tokens=3, **PINNED),
    completion(
        "completion_stream_usage",
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        max_tokens=2,
        **PINNED,
    ),
    completion(
        "completion_stream_echo_logprobs",
        stream=True,
        echo=True,
        logprobs=1,
        max_tokens=2,
        **PINNED,
    ),
    # (vLLM 0.32 fails a stream with n > 1, echo and logprobs: its second choice has no
    # prompt logprobs.)
    completion("completion_stream_echo_n2", stream=True, echo=True, n=2, max_tokens=2, **PINNED),
    Case(
        "completion_clamped_to_context",
        "/v1/completions",
        body={"prompt": [5] * 2045, "max_tokens": 10, **PINNED},
    ),
    Case("completion_context_full", "/v1/completions", body={"prompt": [5] * 2048}),
    Case("completion_over_context", "/v1/completions", body={"prompt": [5] * 2049}),
    completion("completion_max_tokens_zero", max_tokens=0),
    completion("completion_logprobs_zero", logprobs=0, max_tokens=2, **PINNED),
    completion("completion_empty_prompt", prompt=""),
    completion(
        "completion_stream_n2_continuous_usage",
        stream=True,
        n=2,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        max_tokens=2,
        **PINNED,
    ),
    Case("completion_out_of_vocabulary", "/v1/completions", body={"prompt": [1, 2, 99999]}),
    Case("completion_negative_id", "/v1/completions", body={"prompt": [1, -2]}),
    completion("completion_logprobs_30", logprobs=30),
    Case("completion_missing_prompt", "/v1/completions", body={"max_tokens": 1}),
    completion("completion_suffix", suffix=" and goodbye", max_tokens=1),
    completion("completion_suffix_echo", suffix=" and goodbye", echo=True, max_tokens=1),
    Case(
        "completion_suffix_token_ids",
        "/v1/completions",
        body={"prompt": [1, 2], "suffix": " and goodbye", "max_tokens": 1},
    ),
    completion("completion_stop_token_ids_out_of_vocabulary", stop_token_ids=[10**7], max_tokens=1),
    chat("chat_stop_token_ids_out_of_vocabulary", stop_token_ids=[10**7], max_tokens=1),
    chat("chat_stop_token_ids_negative", stop_token_ids=[-1], max_tokens=1),
    # Responses
    responses("responses", max_output_tokens=3, temperature=0),
    Case(
        "responses_instructions_tools",
        "/v1/responses",
        body={
            "input": [{"role": "user", "content": "hi"}],
            "instructions": "be brief",
            "max_output_tokens": 2,
            "temperature": 0,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "tool_choice": "none",
        },
    ),
    responses("responses_stream_cut", stream=True, max_output_tokens=3, temperature=0),
    Case(
        "responses_function_call_history",
        "/v1/responses",
        body={
            "input": [
                {"role": "user", "content": "weather?"},
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city": "Paris"}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            ],
            "max_output_tokens": 2,
            "temperature": 0,
        },
    ),
    responses(
        "responses_stream_instructions",
        stream=True,
        instructions="Be brief.",
        max_output_tokens=2,
        temperature=0,
    ),
    responses("responses_over_context", max_output_tokens=5000),
    responses("responses_previous_id", previous_response_id="resp_1", max_output_tokens=1),
    responses(
        "responses_echoed_settings",
        max_output_tokens=1,
        temperature=0,  # a sampled token may be one that says nothing: no output text
        top_p=0.5,
        metadata={"a": "b"},
        user="u",
        text={"format": {"type": "text"}},
        store=True,
    ),
    Case(
        "responses_input_parts",
        "/v1/responses",
        body={
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
            "max_output_tokens": 1,
            "temperature": 0,
        },
    ),
    responses("responses_unknown_model", model="nope"),
    Case("responses_missing_input", "/v1/responses", body={}),
    Case("responses_retrieve_unknown", "/v1/responses/resp_unknown", method="GET"),
    Case("responses_cancel_unknown", "/v1/responses/resp_unknown/cancel", body={}),
    Case("responses_delete", "/v1/responses/resp_unknown", method="DELETE"),
    # other routes
    Case("models", "/v1/models", method="GET"),
    Case("health", "/health", method="GET"),
    Case("unknown_path", "/v1/nope", method="GET"),
    Case("wrong_method", "/v1/chat/completions", method="GET"),
    # the OpenAI SDK reads both alike
    Case("sdk_chat", body={"messages": HI, "max_tokens": 2, "extra_body": PINNED}, sdk=True),
    Case(
        "sdk_chat_stream",
        body={
            "messages": HI,
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
            "extra_body": PINNED,
        },
        sdk=True,
    ),
    Case(
        "sdk_completion",
        "/v1/completions",
        body={"prompt": "hi", "max_tokens": 2, "logprobs": 1, "extra_body": PINNED},
        sdk=True,
    ),
    Case(
        "sdk_responses",
        "/v1/responses",
        body={"input": "hi", "max_output_tokens": 2, "temperature": 0},
        sdk=True,
    ),
    Case(
        "sdk_responses_stream",
        "/v1/responses",
        body={"input": "hi", "max_output_tokens": 2, "temperature": 0, "stream": True},
        sdk=True,
    ),
    Case("sdk_chat_n0", body={"messages": HI, "n": 0}, sdk=True),
    Case("sdk_unknown_model", body={"messages": HI, "model": "nope"}, sdk=True),
]

# What a value is compared as, by the key it sits under.
_ID_KEYS = {"id", "item_id", "call_id"}
_TIME_KEYS = {"created", "created_at"}
_TEXT_KEYS = {
    "content",
    "text",
    "delta",
    "token",
    "tokens",
    "decoded_token",
    "arguments",
    "message",
}
_TOP_MAPS = {"top_logprobs", "prompt_logprobs"}  # completions: {token: logprob} per position


def normalise(value: Any, key: str | None = None) -> Any:
    """``value`` with what may differ replaced by a placeholder; dicts become lists of
    ``[key, value]`` pairs so that key order counts."""
    if isinstance(value, dict):
        if key in _TOP_MAPS and "logprob" not in value:
            return "<top>"
        return [[k, normalise(v, k)] for k, v in value.items()]
    if isinstance(value, list):
        if key == "bytes":
            return "<bytes>"
        if key == "text_offset":
            return ["<int>"] * len(value)
        return [normalise(item, key) for item in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float):
        return "<float>"
    if isinstance(value, int):
        return "<int>" if key in _TIME_KEYS else value
    if isinstance(value, str):
        if key in _ID_KEYS:
            return re.sub(r"^([a-z]+[-_]).*$", r"\1<id>", value)
        if key == "system_fingerprint":
            return re.sub(r"-[0-9a-f]+$", "-<hash>", value)
        if key in _TEXT_KEYS:
            return "<text>"
    return value


@dataclass
class Outcome:
    """What a server answered, normalised."""

    status: int
    content_type: str
    body: Any

    def describe(self) -> str:
        return orjson.dumps(
            {"status": self.status, "content_type": self.content_type, "body": self.body},
            option=orjson.OPT_INDENT_2,
        ).decode()


def _loose_param(body: Any) -> Any:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        if error.get("param") is not None:
            error["param"] = "<param>"
    return body


def _sse(text: str) -> list[Any]:
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        event: dict[str, Any] = {}
        for line in block.split("\n"):
            name, _, data = line.partition(": ")
            event[name] = data if name != "data" or data == "[DONE]" else orjson.loads(data)
        events.append(event)
    return events


def _choice_of(event: dict[str, Any]) -> float:
    data = event.get("data")
    choices = data.get("choices") if isinstance(data, dict) else None
    return choices[0]["index"] if choices else float("inf")


def _by_choice(events: list[Any]) -> list[Any]:
    """A stream's events, each choice's chunks together: vLLM interleaves the chunks of
    ``n`` choices in whatever order their engine outputs arrive."""
    return sorted(events, key=_choice_of)


async def run_http(http: httpx.AsyncClient, base_url: str, model: str, case: Case) -> Outcome:
    """Send ``case`` over raw HTTP to the server at ``base_url``."""
    headers = {"content-type": case.content_type, **case.headers}
    content = case.raw
    if content is None and case.body is not None:
        body = case.body
        if isinstance(body, dict):
            body = {"model": model, **body}
        content = orjson.dumps(body)
    if case.method in ("GET", "DELETE"):
        response = await http.request(case.method, base_url + case.path)
    else:
        response = await http.request(
            case.method, base_url + case.path, content=content, headers=headers
        )
    media = response.headers.get("content-type", "").split(";")[0]
    if media == "text/event-stream":
        body_out: Any = _by_choice(_sse(response.text))
    elif response.content:
        body_out = response.json()
    else:
        body_out = None
    if not case.exact_param:
        body_out = _loose_param(body_out)
    return Outcome(response.status_code, media, normalise(body_out))


async def run_sdk(base_url: str, model: str, case: Case) -> Outcome:
    """Send ``case`` through the OpenAI SDK; the parsed objects are compared as dumped."""
    assert isinstance(case.body, dict)
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0)
    body = {"model": model, **case.body}
    create: Callable[..., Any] = {
        "/v1/chat/completions": client.chat.completions.create,
        "/v1/completions": client.completions.create,
        "/v1/responses": client.responses.create,
    }[case.path]
    try:
        result = await create(**body)
        if body.get("stream"):
            dumped: Any = [chunk.model_dump() async for chunk in result]
        else:
            dumped = result.model_dump()
        return Outcome(200, "sdk", normalise(dumped))
    except openai.APIStatusError as exc:
        return Outcome(exc.status_code, "sdk", normalise(exc.body))
    finally:
        await client.close()


async def run(http: httpx.AsyncClient, base_url: str, model: str, case: Case) -> Outcome:
    """Send ``case`` to the server at ``base_url`` (no ``/v1``) serving ``model``."""
    if case.sdk:
        return await run_sdk(base_url, model, case)
    return await run_http(http, base_url, model, case)
