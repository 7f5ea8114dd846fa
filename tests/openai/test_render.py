"""Chat and completions answers the latency path renders, in vLLM 0.32's shape: its fields, in
its order, in the places it puts them (whole answers, the stream's opening, token, finishing
and usage chunks). The key lists are vLLM 0.32's, as its OpenAI server sends them;
tests/real_vllm/test_latency_shapes.py compares against a running vLLM."""

from __future__ import annotations

from typing import Any

import orjson

from router.openai.render import AnswerFacts, AnswerHead, ChatRenderer, CompletionRenderer, Usage
from router.parsers import ParsedDelta, ParsedMessage
from router.parsers.base import ToolCall, ToolCallDelta

FINGERPRINT = "vllm-0.32.0-8f3995b0"
USAGE = Usage(prompt_tokens=7, completion_tokens=3)
HEAD = ["id", "object", "created", "model", "choices"]


def chat(**facts: Any) -> ChatRenderer:
    return ChatRenderer(
        AnswerHead(
            response_id="chatcmpl-1",
            created=1,
            model="m",
            facts=AnswerFacts(system_fingerprint=FINGERPRINT, **facts),
        )
    )


def completion(**facts: Any) -> CompletionRenderer:
    return CompletionRenderer(
        AnswerHead(
            response_id="cmpl-1",
            created=1,
            model="m",
            facts=AnswerFacts(system_fingerprint=FINGERPRINT, **facts),
        )
    )


def chunk(event: bytes | None) -> dict[str, Any]:
    assert event is not None and event.startswith(b"data: ") and event.endswith(b"\n\n")
    return orjson.loads(event[len(b"data: ") :])


def test_a_whole_chat_answer_has_vllms_fields_in_vllms_order() -> None:
    body = chat().response(ParsedMessage(None, "Hi", []), "stop", None, USAGE)
    assert list(body) == [
        *HEAD,
        "service_tier",
        "system_fingerprint",
        "usage",
        "prompt_logprobs",
        "prompt_token_ids",
        "prompt_text",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    ]
    assert body["system_fingerprint"] == FINGERPRINT
    choice = body["choices"][0]
    assert list(choice) == [
        "index",
        "message",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "routed_experts",
    ]
    # `reasoning` only (no `reasoning_content`), and no `tool_calls` key without calls.
    assert choice["message"] == {
        "role": "assistant",
        "content": "Hi",
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }
    assert list(choice["message"])[-1] == "reasoning"
    assert list(body["usage"]) == [
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
    ]
    assert body["usage"]["prompt_tokens_details"] is None


def test_tool_calls_come_before_the_reasoning_as_vllm_orders_them() -> None:
    message = ParsedMessage("Hm", None, [ToolCall("call_1", "w", '{"a": 1}')])
    body = chat().response(message, "tool_calls", None, USAGE)
    msg = body["choices"][0]["message"]
    assert list(msg)[-2:] == ["tool_calls", "reasoning"]
    assert msg["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": '{"a": 1}'}}
    ]
    assert msg["reasoning"] == "Hm"


def test_cached_prompt_tokens_are_reported_when_the_prefill_counted_them() -> None:
    usage = Usage(prompt_tokens=7, completion_tokens=3, cached_tokens=4)
    body = chat().response(ParsedMessage(None, "Hi", []), "stop", None, usage)
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}
    assert chunk(chat().usage(usage))["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}


def test_a_chat_stream_without_usage_puts_the_fingerprint_on_the_finishing_chunk() -> None:
    r = chat()
    opening = chunk(r.start())
    assert list(opening) == [*HEAD, "prompt_token_ids", "prompt_text"]
    assert opening["choices"][0] == {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    token = chunk(r.delta(ParsedDelta(content="Hi")))
    assert list(token) == HEAD
    assert token["choices"][0] == {
        "index": 0,
        "delta": {"content": "Hi"},
        "logprobs": None,
        "finish_reason": None,
        "token_ids": None,
    }
    finishing = chunk(r.finish("stop", " STOP"))
    assert list(finishing) == [*HEAD, "system_fingerprint"]
    assert finishing["system_fingerprint"] == FINGERPRINT
    assert finishing["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
        "stop_reason": " STOP",
        "token_ids": None,
    }


def test_with_include_usage_the_fingerprint_rides_on_the_usage_chunk_alone() -> None:
    r = chat(include_usage=True)
    assert "system_fingerprint" not in chunk(r.finish("length", None))
    usage = chunk(r.usage(USAGE))
    assert list(usage) == [*HEAD, "usage", "system_fingerprint"]
    assert usage["choices"] == []
    # vLLM sends the usage chunk without its null fields.
    assert usage["usage"] == {"prompt_tokens": 7, "total_tokens": 10, "completion_tokens": 3}
    assert usage["system_fingerprint"] == FINGERPRINT


def test_without_a_fingerprint_no_chunk_names_one() -> None:
    r = ChatRenderer(AnswerHead(response_id="chatcmpl-1", created=1, model="m"))
    assert "system_fingerprint" not in chunk(r.finish("stop", None))
    assert "system_fingerprint" not in chunk(r.usage(USAGE))
    body = r.response(ParsedMessage(None, "", []), "stop", None, USAGE)
    assert body["system_fingerprint"] is None


def test_continuous_usage_follows_the_choices_with_chats_completion_details() -> None:
    r = chat(include_usage=True)
    opening = chunk(r.start(Usage(7, 0)))
    assert list(opening) == [*HEAD, "usage", "prompt_token_ids", "prompt_text"]
    assert opening["usage"] == {
        "prompt_tokens": 7,
        "total_tokens": 7,
        "completion_tokens": 0,
        "completion_tokens_details": None,
    }
    token = chunk(r.delta(ParsedDelta(content="a"), Usage(7, 1)))
    assert list(token) == [*HEAD, "usage"]
    assert list(token["usage"]) == [
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "completion_tokens_details",
    ]


def test_a_delta_names_vllms_fields_in_vllms_order() -> None:
    delta = ParsedDelta(reasoning="so", content="Hi")
    assert list(chunk(chat().delta(delta))["choices"][0]["delta"]) == ["content", "reasoning"]
    reasoning = chunk(chat().delta(ParsedDelta(reasoning="so")))["choices"][0]["delta"]
    assert reasoning == {"reasoning": "so"}
    first = ToolCallDelta(0, id="call_1", name="w", arguments="")
    calls = chunk(chat().delta(ParsedDelta(tool_calls=[first])))["choices"][0]["delta"]
    assert calls == {
        "tool_calls": [{"id": "call_1", "type": "function", "index": 0, "function": {"name": "w"}}]
    }
    assert list(calls["tool_calls"][0]) == ["id", "type", "index", "function"]
    more = ToolCallDelta(0, arguments='{"a"')
    calls = chunk(chat().delta(ParsedDelta(tool_calls=[more])))["choices"][0]["delta"]
    assert calls == {"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}


def test_a_whole_completion_has_vllms_fields_in_vllms_order() -> None:
    body = completion().response(ParsedMessage(None, "Hi", []), "length", None, USAGE)
    assert list(body) == [
        *HEAD,
        "service_tier",
        "system_fingerprint",
        "usage",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    ]
    assert body["object"] == "text_completion"
    assert body["system_fingerprint"] == FINGERPRINT
    assert list(body["choices"][0]) == [
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "prompt_logprobs",
        "prompt_token_ids",
        "routed_experts",
    ]


def test_a_completion_stream_has_vllms_chunks() -> None:
    r = completion()
    assert r.start() is None
    token = chunk(r.delta(ParsedDelta(content="Hi")))
    assert list(token) == HEAD
    assert token["choices"][0] == {
        "index": 0,
        "text": "Hi",
        "logprobs": None,
        "finish_reason": None,
        "stop_reason": None,
        "prompt_token_ids": None,
        "token_ids": None,
    }
    finishing = chunk(r.finish("stop", "e"))
    assert list(finishing) == [*HEAD, "system_fingerprint"]
    assert (finishing["choices"][0]["finish_reason"], finishing["choices"][0]["stop_reason"]) == (
        "stop",
        "e",
    )
    # Completions' running usage has no completion details, unlike chat's.
    running = chunk(completion(include_usage=True).delta(ParsedDelta(content="a"), Usage(2, 1)))
    assert running["usage"] == {"prompt_tokens": 2, "total_tokens": 3, "completion_tokens": 1}
    usage = chunk(completion(include_usage=True).usage(Usage(2, 1)))
    assert list(usage) == [*HEAD, "usage", "system_fingerprint"]
