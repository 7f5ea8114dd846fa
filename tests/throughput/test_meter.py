"""What a native answer's meter reads from it: time to the first bytes, gaps between
events, usage and finish reason, into the request's access record and the metrics."""

from __future__ import annotations

import orjson

from router.telemetry.metrics import Metrics
from router.throughput.meter import AnswerMeter
from tests.throughput.support import routed

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def event(payload: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def delta(text: str) -> bytes:
    return event({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


def test_a_stream_s_usage_split_across_chunks_is_read() -> None:
    metrics = Metrics()
    request = routed(BODY)
    meter = AnswerMeter(request, metrics)
    last = event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    usage = event({"choices": [], "usage": {"prompt_tokens": 17, "completion_tokens": 3}})
    meter.chunk(delta("a"))
    meter.chunk(delta("b") + delta("c"))
    meter.chunk(last + usage[:20])
    meter.chunk(usage[20:] + b"data: [DONE]\n\n")
    meter.close()  # the stream's gaps reach the histogram

    access = request.access
    assert (access.prompt_tokens, access.completion_tokens) == (17, 3)
    assert access.finish_reason == "length"
    assert access.ttft_ms is not None and access.ttft_ms >= 0
    ttft = {"model": "m", "path": "throughput"}
    assert metrics.registry.get_sample_value("pd_gateway_ttft_seconds_count", ttft) == 1
    # Three chunks after the first, each timed as one gap per event in it.
    assert metrics.registry.get_sample_value("pd_gateway_inter_token_seconds_count", ttft) == 3


def test_a_stream_without_usage_leaves_the_counts_unknown() -> None:
    request = routed(BODY)
    meter = AnswerMeter(request, None)
    meter.chunk(delta("a") + delta("b") + b"data: [DONE]\n\n")
    assert (request.access.prompt_tokens, request.access.completion_tokens) == (None, None)
    assert request.access.ttft_ms is not None


def test_a_whole_body_s_usage_and_finish_reason_are_read() -> None:
    request = routed({**BODY, "stream": False})
    body = {
        "choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
    }
    AnswerMeter(request, None).body(orjson.dumps(body))
    access = request.access
    assert (access.prompt_tokens, access.completion_tokens, access.finish_reason) == (9, 2, "stop")
    assert access.ttft_ms is None, "a whole answer has no first bytes apart from its last"


def test_a_body_that_is_not_json_is_left_alone() -> None:
    request = routed({**BODY, "stream": False})
    AnswerMeter(request, None).body(b'{"prompt_tokens": oops')
    assert request.access.prompt_tokens is None


def test_a_whole_error_body_names_its_type_as_the_error_code() -> None:
    request = routed({**BODY, "stream": False})
    error = {"message": "no such model", "type": "NotFoundError", "param": None, "code": 404}
    AnswerMeter(request, None).body(orjson.dumps({"error": error}))
    assert request.access.error_code == "NotFoundError"


def test_a_stream_s_error_event_names_its_code_and_status() -> None:
    request = routed(BODY)
    meter = AnswerMeter(request, None)
    error = {"message": "engine died", "type": "InternalServerError", "param": None, "code": 500}
    meter.chunk(delta("a") + event({"error": error}) + b"data: [DONE]\n\n")
    assert (request.access.error_code, request.access.status) == ("InternalServerError", 500)


def responses_event(payload: dict[str, object]) -> bytes:
    return b"event: " + str(payload["type"]).encode() + b"\n" + event(payload)


def test_a_responses_stream_s_usage_is_read_from_its_completed_event() -> None:
    request = routed(BODY)
    meter = AnswerMeter(request, None)
    usage = {"input_tokens": 12, "output_tokens": 5, "total_tokens": 17}
    meter.chunk(responses_event({"type": "response.output_text.delta", "delta": "hi"}))
    completed = responses_event(
        {"type": "response.completed", "response": {"status": "completed", "usage": usage}}
    )
    meter.chunk(completed[:30])
    meter.chunk(completed[30:])
    assert (request.access.prompt_tokens, request.access.completion_tokens) == (12, 5)


def test_a_responses_stream_s_error_event_names_its_code() -> None:
    request = routed(BODY)
    meter = AnswerMeter(request, None)
    meter.chunk(responses_event({"type": "error", "code": "server_error", "message": "boom"}))
    assert request.access.error_code == "server_error"


def test_a_whole_response_s_usage_is_read() -> None:
    request = routed({**BODY, "stream": False})
    body = {"object": "response", "usage": {"input_tokens": 7, "output_tokens": 3}}
    AnswerMeter(request, None).body(orjson.dumps(body))
    assert (request.access.prompt_tokens, request.access.completion_tokens) == (7, 3)
