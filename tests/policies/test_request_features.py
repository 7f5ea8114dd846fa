"""Features extracted from request bodies: budgets, headers, prompt sizes, guard fields."""

from __future__ import annotations

from typing import Any

import pytest

from policies import features_from_request
from policies.features import RequestFeatures
from policies.types import Endpoint


def extract(body: dict[str, Any], endpoint: Endpoint = "chat", **kw: Any) -> RequestFeatures:
    return features_from_request(
        {"model": "glm-5", **body},
        endpoint=endpoint,
        headers=kw.get("headers", {}),
        api_key_name=kw.get("api_key_name"),
    )


def chat(content: Any, **body: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], **body}


def test_the_service_tier_the_client_asked_for() -> None:
    assert extract(chat("hi", service_tier="priority")).service_tier == "priority"
    assert extract(chat("hi")).service_tier is None
    assert extract({"prompt": "hi", "service_tier": "flex"}, "completions").service_tier == "flex"


def test_plain_chat_request() -> None:
    features = extract(
        chat("hello", user="u1", metadata={"tier": "gold"}, stream=True),
        headers={"X-Workload": "agent", "Content-Type": "application/json"},
        api_key_name="team-a",
    )
    assert features.model == "glm-5"
    assert features.endpoint == "chat"
    assert features.headers == {"x-workload": "agent", "content-type": "application/json"}
    assert features.api_key_name == "team-a"
    assert features.user == "u1"
    assert features.metadata == {"tier": "gold"}
    assert features.stream is True
    assert features.max_tokens is None
    assert features.has_tools is False
    assert features.prompt_bytes == 5
    assert features.prompt_items == 1
    assert features.prompt_tokens is None
    assert features.options.prompts == 1


@pytest.mark.parametrize(
    ("endpoint", "body", "budget"),
    [
        ("chat", {"max_tokens": 100}, 100),
        ("chat", {"max_completion_tokens": 50, "max_tokens": 100}, 50),
        ("chat", {"max_completion_tokens": None, "max_tokens": 100}, 100),
        ("chat", {}, None),
        ("chat", {"max_tokens": True}, None),
        ("completions", {"max_tokens": 7}, 7),
        ("completions", {"max_completion_tokens": 7}, None),
    ],
)
def test_completion_budget(endpoint: Endpoint, body: dict[str, Any], budget: int | None) -> None:
    assert extract({**chat("x"), "prompt": "x", **body}, endpoint).max_tokens == budget


@pytest.mark.parametrize(
    ("body", "stream", "user", "metadata", "tools"),
    [
        (chat("x", stream="true"), False, None, {}, False),
        (chat("x", user=5, metadata=["a"]), False, None, {}, False),
        (chat("x", tools=[]), False, None, {}, False),
        (chat("x", tools=[{"type": "function", "function": {"name": "f"}}]), False, None, {}, True),
    ],
)
def test_malformed_or_empty_fields_are_neutral(
    body: dict[str, Any], stream: bool, user: str | None, metadata: dict[str, Any], tools: bool
) -> None:
    features = extract(body)
    assert (features.stream, features.user, dict(features.metadata), features.has_tools) == (
        stream,
        user,
        metadata,
        tools,
    )


def test_prompt_bytes_count_utf8_of_every_rendered_text() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    body = {
        "messages": [
            {"role": "system", "content": "héllo"},  # 6 bytes
            {"role": "user", "content": [{"type": "text", "text": "日本"}]},  # 6 bytes
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "think",
                "tool_calls": [{"function": {"name": "f", "arguments": '{"a":1}'}}],  # 1+7
            },
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},  # 2+2
        ],
        "tools": tools,
    }
    features = extract(body)
    tools_json = '[{"type": "function", "function": {"name": "get_weather"}}]'  # json.dumps default
    assert features.prompt_bytes == 6 + 6 + 8 + 4 + len(tools_json)
    assert features.prompt_optional_bytes == 5
    assert features.prompt_items == 4 + 1 + 1  # messages, content parts, tools
    assert not features.prompt_opaque


def test_non_text_parts_make_the_prompt_opaque() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    features = extract(chat([{"type": "text", "text": "what is this?"}, image]))
    assert features.prompt_opaque
    assert features.prompt_bytes == len("what is this?")


@pytest.mark.parametrize(
    ("prompt", "size", "tokens", "prompts", "opaque"),
    [
        ("héllo", 6, None, 1, False),
        ([1, 2, 3], 0, 3, 1, False),
        (["ab", "cde"], 5, None, 2, False),
        ([[1, 2], [3]], 0, 3, 2, False),
        (["ab", [1, 2]], 2, None, 2, True),
        (None, 0, None, 1, False),
    ],
)
def test_completions_prompts(
    prompt: Any, size: int, tokens: int | None, prompts: int, opaque: bool
) -> None:
    features = extract({"prompt": prompt}, "completions")
    assert features.prompt_bytes == size
    assert features.prompt_tokens == tokens
    assert features.options.prompts == prompts
    assert features.prompt_opaque is opaque
    assert features.has_tools is False


def test_guard_fields_are_kept_as_sent() -> None:
    body = chat(
        "x",
        n=2,
        logprobs=True,
        top_logprobs=3,
        logit_bias={"1": 5},
        presence_penalty=0.5,
        guided_regex="a+",
        structured_outputs={"json": {}},
        response_format={"type": "json_object"},
        tool_choice="required",
    )
    options = extract(body).options
    assert options.n == 2
    assert options.logprobs is True
    assert options.top_logprobs == 3
    assert options.logit_bias == {"1": 5}
    assert options.presence_penalty == 0.5
    assert options.guided == ("guided_regex", "structured_outputs")
    assert options.response_format == {"type": "json_object"}
    assert options.tool_choice == "required"
    assert options.best_of is None
