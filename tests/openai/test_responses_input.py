"""A Responses request as the chat request the latency path and the classifier work on."""

from __future__ import annotations

from typing import Any

import pytest

from router.errors import InvalidRequest
from router.openai.requests import ChatRequest, ResponsesRequest, validate
from router.openai.responses_input import chat_body


def translate(**body: Any) -> dict[str, Any]:
    body = {"model": "m", **body}
    chat = chat_body(validate(ResponsesRequest, body), body)
    validate(ChatRequest, chat)  # always a valid chat request
    return chat


def test_a_string_input_is_one_user_message_after_the_instructions() -> None:
    chat = translate(input="Hi", instructions="Be brief.", max_output_tokens=7, temperature=0.5)
    assert chat == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ],
        "max_tokens": 7,
        "temperature": 0.5,
    }


def test_items_become_messages_and_a_function_turn() -> None:
    chat = translate(
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hmm"}]},
            {"type": "message", "role": "assistant", "content": "Let me look."},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"}
                ],
            },
        ]
    )
    assert chat["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "w", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}}
            ],
        },
    ]


def test_function_tools_choice_format_and_effort() -> None:
    chat = translate(
        input="x",
        tools=[{"type": "function", "name": "w", "parameters": {"type": "object"}, "strict": True}],
        tool_choice={"type": "function", "name": "w"},
        text={"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}},
        reasoning={"effort": "low", "summary": "auto"},
        parallel_tool_calls=False,
    )
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "w", "parameters": {"type": "object"}, "strict": True},
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": {"type": "object"}},
    }
    assert chat["reasoning_effort"] == "low"
    assert chat["parallel_tool_calls"] is False
    assert "text" not in chat and "reasoning" not in chat


def test_streaming_asks_for_usage_and_logprobs_follow_include() -> None:
    chat = translate(
        input="x", stream=True, include=["message.output_text.logprobs"], top_logprobs=3
    )
    assert chat["stream_options"] == {"include_usage": True}
    assert (chat["logprobs"], chat["top_logprobs"]) == (True, 3)
    assert "logprobs" not in translate(input="x", include=[])


def test_unknown_fields_pass_through_and_responses_fields_do_not() -> None:
    chat = translate(input="x", top_k=5, truncation="auto", store=False, user="u")
    assert (chat["top_k"], chat["user"]) == (5, "u")
    assert "truncation" not in chat and "store" not in chat and "input" not in chat


@pytest.mark.parametrize(
    ("extra", "marker"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"tools": [{"type": "web_search"}]}, "hosted_tools"),
        ({"tool_choice": {"type": "file_search"}}, "hosted_tools"),
        ({"prompt": {"id": "pmpt_1"}}, "hosted_tools"),
    ],
)
def test_what_needs_vllms_server_is_marked_for_the_guard(
    extra: dict[str, Any], marker: str
) -> None:
    assert marker in translate(input="x", **extra)


def test_items_of_hosted_tools_are_marked() -> None:
    chat = translate(
        input=[{"type": "item_reference", "id": "x"}, {"role": "user", "content": "y"}]
    )
    assert chat["hosted_tools"] == ["item_reference"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": ["text"]}, "input[0]"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": [], "content": ""}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": []}]}]}, "input[0].content[0]"),
        ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "input[0].content[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0]"),
        (
            {"input": [{"type": "function_call", "name": "w", "arguments": "{}"}]},
            "input[0].call_id",
        ),
        ({"input": [{"type": 3}]}, "input[0].type"),
        ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"input": "x", "tools": ["w"]}, "tools[0]"),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format.name"),
    ],
)
def test_bad_input_is_named(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        translate(**body)
    assert caught.value.param == param


def test_fields_are_typed_before_translation() -> None:
    with pytest.raises(InvalidRequest) as caught:
        validate(ResponsesRequest, {"model": "m", "input": "x", "max_output_tokens": "5.5"})
    assert caught.value.param == "max_output_tokens"
