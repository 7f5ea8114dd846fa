"""The Responses renderer's events and objects, validated against the OpenAI SDK's own types
and replayed through the SDK's stream accumulator (`responses.stream` uses it)."""

from __future__ import annotations

import re
from typing import Any, get_args

import orjson
import pytest
from openai import omit
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent

from router.errors import UpstreamError
from router.openai.render import AnswerFacts, AnswerHead, TokenLogprob, Usage
from router.openai.responses_render import ResponsesRenderer
from router.parsers import ParsedDelta, ParsedMessage
from router.parsers.base import ToolCall, ToolCallDelta

# The SDK's event class of each event type (its union is discriminated by the SDK, not pydantic).
EVENT_CLASSES = {
    get_args(cls.model_fields["type"].annotation)[0]: cls
    for cls in get_args(get_args(ResponseStreamEvent)[0])
}
USAGE = Usage(prompt_tokens=10, completion_tokens=6, cached_tokens=4)
TOOL = {"type": "function", "name": "w", "parameters": {"type": "object"}}


def renderer(**body: Any) -> ResponsesRenderer:
    return ResponsesRenderer(
        AnswerHead(
            response_id="chatcmpl-abc", created=1, model="m", client_body={"input": "x", **body}
        )
    )


def parse(stream: bytes) -> list[Any]:
    """Each SSE event, its `event:` line checked against its type, validated strictly."""
    events = []
    for block in stream.split(b"\n\n"):
        if not block:
            continue
        kind_line, data_line = block.split(b"\n")
        data = orjson.loads(data_line.removeprefix(b"data: "))
        assert kind_line == b"event: " + data["type"].encode()
        events.append(EVENT_CLASSES[data["type"]].model_validate(data))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


def replay(events: list[Any], tools: list[Any] | None = None) -> Any:
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=tools or [], text_format=omit)
    for event in events:
        state.handle_event(event)
    return state


def stream(r: ResponsesRenderer, deltas: list[ParsedDelta], finish: str = "stop") -> bytes:
    out = r.start() or b""
    for delta in deltas:
        out += r.delta(delta) or b""
    return out + r.finish(finish, None) + r.usage(USAGE) + r.end()


def test_reasoning_then_text_then_two_calls() -> None:
    deltas = [
        ParsedDelta(reasoning="Think"),
        ParsedDelta(reasoning="ing."),
        ParsedDelta(content="Calling."),
        ParsedDelta(tool_calls=[ToolCallDelta(0, id="call_a", name="w", arguments='{"a"')]),
        ParsedDelta(tool_calls=[ToolCallDelta(0, arguments=": 1}")]),
        ParsedDelta(tool_calls=[ToolCallDelta(1, id="call_b", name="w", arguments="{}")]),
    ]
    events = parse(stream(renderer(tools=[TOOL]), deltas))
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = events[-1].response
    assert final.id == "resp_abc" and final.status == "completed"
    assert [item.type for item in final.output] == [
        "reasoning",
        "message",
        "function_call",
        "function_call",
    ]
    assert final.output_text == "Calling."
    assert [(c.call_id, c.arguments) for c in final.output[2:]] == [
        ("call_a", '{"a": 1}'),
        ("call_b", "{}"),
    ]
    assert final.usage.input_tokens_details.cached_tokens == 4
    assert final.usage.total_tokens == 16
    # An item is announced without its part (the SDK appends the part it is sent next): a
    # reasoning item with no content at all, a message with none yet, as vLLM does.
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [getattr(item, "content", None) for item in added] == [None, [], None, None]
    assert replay(events, [TOOL])._completed_response is not None


def test_length_ends_completed_with_an_incomplete_status_as_vllm_does() -> None:
    events = parse(stream(renderer(), [ParsedDelta(content="cut")], finish="length"))
    assert events[-1].type == "response.completed"
    assert events[-1].response.status == "incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


def test_an_error_fails_the_response_and_closes_the_open_item() -> None:
    r = renderer()
    out = (r.start() or b"") + (r.delta(ParsedDelta(content="par")) or b"")
    out += r.error(UpstreamError("the node went away", code="decode_truncated")) + r.end()
    events = parse(out)
    assert [e.type for e in events[-4:]] == [
        "response.content_part.done",
        "response.output_item.done",
        "error",
        "response.failed",
    ]
    assert events[-2].code == "decode_truncated"
    assert events[-1].response.error.message == "the node went away"
    assert events[-1].response.output[0].content[0].text == "par"


def test_logprobs_ride_on_the_text_deltas() -> None:
    r = renderer()
    entry = TokenLogprob("hé", -0.5, (("hé", -0.5), ("ha", -1.5)))
    out = (r.start() or b"") + (r.delta(ParsedDelta(content="hé"), logprobs=[entry]) or b"")
    events = parse(out + r.finish("stop", None) + r.usage(USAGE))
    delta = next(e for e in events if e.type == "response.output_text.delta")
    assert delta.logprobs[0].token == "hé"
    assert [t.token for t in delta.logprobs[0].top_logprobs] == ["hé", "ha"]
    final = events[-1].response
    assert final.output[0].content[0].logprobs[0].logprob == -0.5
    assert final.output[0].content[0].logprobs[0].bytes == list("hé".encode())


def test_logprobs_of_reasoning_tokens_open_no_message() -> None:
    r = renderer()
    entry = TokenLogprob("x", -0.1, ())
    out = (r.start() or b"") + (r.delta(ParsedDelta(reasoning="x"), logprobs=[entry]) or b"")
    events = parse(out + r.finish("stop", None) + r.usage(USAGE))
    assert [item.type for item in events[-1].response.output] == ["reasoning"]


@pytest.mark.parametrize(
    ("message", "kinds"),
    [
        (ParsedMessage(None, "Hi", []), ["message"]),
        (ParsedMessage("Hm", None, [ToolCall("c", "w", "{}")]), ["reasoning", "function_call"]),
        (ParsedMessage(None, None, []), ["message"]),
    ],
)
def test_whole_response_is_an_sdk_response(message: ParsedMessage, kinds: list[str]) -> None:
    body = renderer(instructions="Be brief.", max_output_tokens=9).response(
        message, "stop", None, USAGE
    )
    response = Response.model_validate(body)
    assert [item.type for item in response.output] == kinds
    assert (response.instructions, response.max_output_tokens) == ("Be brief.", 9)
    assert response.output_text == (message.content or "")


# vLLM 0.32's `response` object, its fields in its order.
VLLM_RESPONSE_KEYS = [
    "id",
    "created_at",
    "incomplete_details",
    "instructions",
    "metadata",
    "model",
    "object",
    "output",
    "parallel_tool_calls",
    "temperature",
    "tool_choice",
    "tools",
    "top_p",
    "background",
    "max_output_tokens",
    "max_tool_calls",
    "previous_response_id",
    "prompt",
    "reasoning",
    "service_tier",
    "status",
    "text",
    "top_logprobs",
    "truncation",
    "usage",
    "user",
    "presence_penalty",
    "frequency_penalty",
    "kv_transfer_params",
    "ec_transfer_params",
    "input_messages",
    "output_messages",
]


def test_the_response_object_has_vllms_fields_in_vllms_order() -> None:
    facts = AnswerFacts(temperature=0.5, top_p=0.9, max_tokens=2041)
    body = ResponsesRenderer(
        AnswerHead(
            response_id="chatcmpl-abc",
            created=1,
            model="m",
            client_body={"input": "x"},
            facts=facts,
        )
    ).response(ParsedMessage(None, "Hi", []), "stop", None, USAGE)
    assert list(body) == VLLM_RESPONSE_KEYS
    # The sampling the output was made with, and vLLM's reading of a request without tools.
    assert (body["temperature"], body["top_p"], body["max_output_tokens"]) == (0.5, 0.9, 2041)
    assert (body["tool_choice"], body["text"], body["service_tier"]) == ("none", None, "auto")
    assert (body["presence_penalty"], body["frequency_penalty"]) == (0.0, 0.0)
    assert list(body["usage"]["input_tokens_details"]) == [
        "cached_tokens",
        "cache_write_tokens",
        "input_tokens_per_turn",
        "cached_tokens_per_turn",
    ]
    assert list(body["usage"]["output_tokens_details"]) == [
        "reasoning_tokens",
        "tool_output_tokens",
        "output_tokens_per_turn",
        "tool_output_tokens_per_turn",
    ]
    message = body["output"][0]
    assert list(message) == ["id", "content", "role", "status", "type", "phase"]
    # No logprobs asked for: null, as vLLM says it.
    assert message["content"][0] == {
        "annotations": [],
        "text": "Hi",
        "type": "output_text",
        "logprobs": None,
    }
    with_tools = renderer(tools=[TOOL]).response(ParsedMessage(None, "Hi", []), "stop", None, USAGE)
    assert with_tools["tool_choice"] == "auto"
    Response.model_validate(body)


def test_whole_items_have_vllms_shape() -> None:
    message = ParsedMessage("Hm", None, [ToolCall("call_1", "w", "{}")])
    reasoning, call = renderer(tools=[TOOL]).response(message, "tool_calls", None, USAGE)["output"]
    assert reasoning == {
        "id": reasoning["id"],
        "summary": [],
        "type": "reasoning",
        "content": [{"text": "Hm", "type": "reasoning_text"}],
        "encrypted_content": None,
        "status": None,
    }
    assert list(call) == [
        "arguments",
        "call_id",
        "name",
        "type",
        "id",
        "async",
        "caller",
        "namespace",
        "status",
    ]
    assert (call["call_id"], call["status"]) == ("call_1", "completed")


ITEM_ID = re.compile(r"(msg|rs|fc)_[0-9a-f]{16}")


def test_items_are_named_as_vllm_names_them() -> None:
    """vLLM 0.32: the kind's prefix and 16 hex digits (`msg_5f0c...`), each item its own."""
    message = ParsedMessage("Hm", "Hi", [ToolCall("call_1", "w", "{}")])
    output = renderer(tools=[TOOL]).response(message, "tool_calls", None, USAGE)["output"]
    delta = ParsedDelta(reasoning="Hm", content="Hi", tool_calls=[ToolCallDelta(0, "call_1", "w")])
    events = parse(stream(renderer(tools=[TOOL]), [delta], "tool_calls"))
    streamed = [e.item.id for e in events if e.type == "response.output_item.added"]
    ids = [item["id"] for item in output] + streamed
    assert [i.split("_")[0] for i in ids] == ["rs", "msg", "fc"] * 2
    assert all(ITEM_ID.fullmatch(i) for i in ids), ids
    assert len(set(ids)) == len(ids)


def test_events_name_their_fields_in_the_sdks_order() -> None:
    r = renderer(tools=[TOOL])
    out = (r.start() or b"") + (r.delta(ParsedDelta(content="Hi")) or b"")
    out += r.delta(ParsedDelta(tool_calls=[ToolCallDelta(0, id="c", name="w", arguments="{}")]))
    out += r.finish("tool_calls", None) + r.usage(USAGE)
    payloads = [
        orjson.loads(block.split(b"\n")[1].removeprefix(b"data: "))
        for block in out.split(b"\n\n")
        if block
    ]
    keys = {p["type"]: list(p) for p in payloads}
    assert keys["response.created"] == ["response", "sequence_number", "type"]
    assert keys["response.output_text.delta"] == [
        "content_index",
        "delta",
        "item_id",
        "logprobs",
        "output_index",
        "sequence_number",
        "type",
    ]
    assert keys["response.output_text.done"] == [
        "content_index",
        "item_id",
        "logprobs",
        "output_index",
        "sequence_number",
        "text",
        "type",
    ]
    # vLLM adds the function's name after the SDK's fields.
    assert keys["response.function_call_arguments.done"] == [
        "arguments",
        "item_id",
        "output_index",
        "sequence_number",
        "type",
        "name",
    ]
    added = [p["item"] for p in payloads if p["type"] == "response.output_item.added"]
    assert added[1]["created_by"] is None and added[1]["status"] == "in_progress"
    assert payloads[-1]["type"] == "response.completed"
