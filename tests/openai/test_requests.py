"""Request validation: every bad input is a 400 naming the problem; unknown fields pass."""

from __future__ import annotations

import pytest

from router.errors import InvalidRequest
from router.openai.endpoints import ENDPOINTS
from router.openai.requests import ChatRequest, CompletionRequest, parse_body, validate

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
PROMPT = {"model": "m", "prompt": "x"}


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b"", "not valid JSON"),
    ],
)
def test_malformed_bodies(raw: bytes, needle: str) -> None:
    with pytest.raises(InvalidRequest) as bad:
        parse_body(raw)
    assert needle in bad.value.message
    assert bad.value.status == 400


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        ("chat", {"model": "m"}, "messages"),
        ("chat", {"messages": CHAT["messages"]}, "model"),
        ("chat", {**CHAT, "messages": []}, "messages"),
        ("chat", {**CHAT, "messages": "hi"}, "messages"),
        ("chat", {**CHAT, "messages": [{"role": 5, "content": "x"}]}, "messages.0.role"),
        ("chat", {**CHAT, "messages": [{"role": "r" * 33, "content": "x"}]}, "messages.0.role"),
        ("chat", {**CHAT, "messages": [{"content": "x"}]}, "messages.0.role"),
        ("chat", {**CHAT, "max_tokens": -1}, "max_tokens"),
        ("chat", {**CHAT, "max_tokens": 0}, "max_tokens"),
        ("chat", {**CHAT, "max_tokens": 10**12}, "max_tokens"),
        ("chat", {**CHAT, "max_tokens": "abc"}, "max_tokens"),
        ("chat", {**CHAT, "max_tokens": "5.5"}, "max_tokens"),
        ("chat", {**CHAT, "max_tokens": "1e3"}, "max_tokens"),
        ("chat", {**CHAT, "max_tokens": "9" * 5000}, "max_tokens"),
        ("chat", {**CHAT, "max_tokens": []}, "max_tokens"),
        ("chat", {**CHAT, "max_completion_tokens": 1.5}, "max_completion_tokens"),
        ("chat", {**CHAT, "max_completion_tokens": 0}, "max_completion_tokens"),
        ("chat", {**CHAT, "stream": "maybe"}, "stream"),
        ("chat", {**CHAT, "stream": 2}, "stream"),
        ("chat", {**CHAT, "temperature": "abc"}, "temperature"),
        ("chat", {**CHAT, "temperature": "inf"}, "temperature"),
        ("chat", {**CHAT, "temperature": "nan"}, "temperature"),
        ("chat", {**CHAT, "temperature": "-1"}, "temperature"),
        ("chat", {**CHAT, "model": 5}, "model"),
        ("chat", {**CHAT, "temperature": -0.1}, "temperature"),
        ("chat", {**CHAT, "top_p": 0}, "top_p"),
        ("chat", {**CHAT, "stop": 5}, "stop"),
        ("chat", {**CHAT, "stop_token_ids": [-3]}, "stop_token_ids.0"),
        ("chat", {**CHAT, "tools": [{"type": "function"}]}, "tools.0.function"),
        (
            "chat",
            {**CHAT, "stream_options": {"include_usage": "perhaps"}},
            "stream_options.include_usage",
        ),
        ("completions", {"model": "m"}, "prompt"),
        ("completions", {"model": "m", "prompt": 3}, "prompt"),
        ("completions", {"model": 3, "prompt": "x"}, "model"),
        ("completions", {**PROMPT, "max_tokens": 0}, "max_tokens"),
        ("completions", {**PROMPT, "max_tokens": 0, "echo": False}, "max_tokens"),
        ("completions", {**PROMPT, "max_tokens": -1, "echo": True}, "max_tokens"),
        ("chat", {**CHAT, "service_tier": "ultra"}, "service_tier"),
        ("completions", {**PROMPT, "service_tier": 1}, "service_tier"),
        ("responses", {"model": "m", "input": "hi", "service_tier": "fast"}, "service_tier"),
    ],
)
def test_invalid_fields_are_named(endpoint: str, body: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as bad:
        validate(ENDPOINTS[endpoint].request, body)
    assert bad.value.param == param
    assert param.split(".")[0] in bad.value.message


def test_unknown_fields_are_kept_for_the_backend() -> None:
    parsed = validate(ChatRequest, {**CHAT, "top_k": 5, "some_vllm_extension": {"a": 1}})
    assert isinstance(parsed, ChatRequest)
    assert parsed.top_k == 5
    assert parsed.model_extra == {"some_vllm_extension": {"a": 1}}


def test_derived_fields() -> None:
    chat = validate(
        ChatRequest,
        {
            **CHAT,
            "max_tokens": 9,
            "max_completion_tokens": 4,
            "stop": "x",
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
        },
    )
    assert chat.token_budget == 4
    assert chat.stop_strings == ["x"]
    assert chat.include_usage
    assert chat.temperature == 0
    completion = validate(CompletionRequest, {"model": "m", "prompt": "p", "stop": ["a", "b"]})
    assert isinstance(completion, CompletionRequest)
    assert completion.stop_strings == ["a", "b"]
    assert not completion.include_usage


@pytest.mark.parametrize(
    ("field", "sent", "read"),
    [
        ("max_tokens", 5.0, 5),
        ("max_tokens", "5", 5),
        ("max_tokens", " 7 ", 7),
        ("max_tokens", True, 1),
        ("temperature", "0", 0.0),
        ("temperature", "0.5", 0.5),
        ("stream", "false", False),
        ("stream", "true", True),
        ("stream", 0, False),
        ("n", "2", 2),
        ("seed", "42", 42),
    ],
)
def test_values_are_read_as_vllm_reads_them_and_written_back(
    field: str, sent: object, read: object
) -> None:
    """Lax as vLLM's pydantic models: a number or boolean in another JSON type is converted,
    and the body carries the converted value on (classification reads the body)."""
    body = {**CHAT, field: sent}
    parsed = validate(ChatRequest, body)
    assert getattr(parsed, field) == read
    assert body[field] == read and type(body[field]) is type(read)


def test_nested_values_are_written_back_and_the_rest_kept_as_sent() -> None:
    body = {
        **CHAT,
        "stream": True,
        "stream_options": {"include_usage": "true", "extension": "5"},
        "stop_token_ids": ["3", 4.0],
        "logit_bias": {"7": "1.5"},
        "top_p": 1,
        "chat_template_kwargs": {"enable_thinking": "false"},
        "vllm_extension": {"depth": "5"},
    }
    parsed = validate(ChatRequest, body)
    assert parsed.include_usage
    assert body["stream_options"] == {"include_usage": True, "extension": "5"}
    assert body["stop_token_ids"] == [3, 4]
    assert body["logit_bias"] == {"7": 1.5}
    # An integer where a float is declared is a JSON number already: left as sent.
    assert body["top_p"] == 1 and type(body["top_p"]) is int
    assert body["chat_template_kwargs"] == {"enable_thinking": "false"}
    assert body["vllm_extension"] == {"depth": "5"}


def test_token_id_prompts_are_written_back_as_integers() -> None:
    body = {"model": "m", "prompt": [[1, "2"], [3.0]]}
    validate(CompletionRequest, body)
    assert body["prompt"] == [[1, 2], [3]]
    assert all(type(token) is int for ids in body["prompt"] for token in ids)


@pytest.mark.parametrize("role", ["critic", "ipython", "observation", "", "r" * 32])
def test_any_role_of_bounded_length_is_accepted(role: str) -> None:
    parsed = validate(ChatRequest, {**CHAT, "messages": [{"role": role, "content": "x"}]})
    assert isinstance(parsed, ChatRequest)
    assert parsed.messages[0].role == role


def test_an_echoed_prompt_may_ask_for_no_tokens_to_score_it() -> None:
    body = {"model": "m", "prompt": "x", "echo": "true", "logprobs": 1, "max_tokens": "0"}
    parsed = validate(CompletionRequest, body)
    assert isinstance(parsed, CompletionRequest)
    assert parsed.max_tokens == 0 and parsed.echo is True
    assert parsed.token_budget == 0
    assert body["max_tokens"] == 0 and body["echo"] is True
    unset = validate(CompletionRequest, {"model": "m", "prompt": "x"})
    assert isinstance(unset, CompletionRequest)
    assert unset.token_budget == 16
