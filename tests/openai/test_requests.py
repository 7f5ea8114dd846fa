"""Request validation: every bad input is a 400 naming the problem; unknown fields pass."""

from __future__ import annotations

import pytest

from router.errors import InvalidRequest
from router.openai.endpoints import ENDPOINTS
from router.openai.requests import ChatRequest, CompletionRequest, parse_body, validate

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


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
        ("chat", {**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ("chat", {**CHAT, "max_tokens": -1}, "max_tokens"),
        ("chat", {**CHAT, "max_tokens": 0}, "max_tokens"),
        ("chat", {**CHAT, "max_tokens": 10**12}, "max_tokens"),
        ("chat", {**CHAT, "max_tokens": "5"}, "max_tokens"),
        ("chat", {**CHAT, "max_completion_tokens": 1.5}, "max_completion_tokens"),
        ("chat", {**CHAT, "stream": "yes"}, "stream"),
        ("chat", {**CHAT, "temperature": -0.1}, "temperature"),
        ("chat", {**CHAT, "top_p": 0}, "top_p"),
        ("chat", {**CHAT, "stop": 5}, "stop"),
        ("chat", {**CHAT, "stop_token_ids": [-3]}, "stop_token_ids.0"),
        ("chat", {**CHAT, "tools": [{"type": "function"}]}, "tools.0.function"),
        (
            "chat",
            {**CHAT, "stream_options": {"include_usage": "no"}},
            "stream_options.include_usage",
        ),
        ("completions", {"model": "m"}, "prompt"),
        ("completions", {"model": "m", "prompt": 3}, "prompt"),
        ("completions", {"model": 3, "prompt": "x"}, "model"),
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
