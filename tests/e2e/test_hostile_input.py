"""A hostile client against the real gateway and simulators: no input gets a 5xx, and input
the gateway refuses never reaches a backend (the simulators' own records say so).

Two halves: a table of hostile shapes (sizes, depths, encodings, types, content types),
each checked for its exact answer; and hypothesis over the request models, where any
answer is fine but a 5xx, and a refusal by the gateway must have called no backend.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.stack import SimStack
from tests.support.classify_fixtures import proxy_throughput
from tests.support.deployment import latency_model, reset, sim_get, simulator_urls
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.http import plain
from tests.support.stacks import StackPool

MODEL = "ds"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
# Errors the gateway raises itself; an upstream's own 4xx carries vLLM's type names.
GATEWAY_ERROR_TYPES = {"invalid_request_error", "authentication_error"}


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=1, prefills=1, proxy=True, model=MODEL, node_args=["--step-ms", "1"]
    )


@pytest.fixture(scope="module")
def gateway(stack: SimStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    models = [latency_model(stack, MODEL, throughput=proxy_throughput(stack))]
    with start_gateway(tmp_path_factory, models, server={"max_body_bytes": 4 * 1024 * 1024}) as gw:
        yield gw


def backend_calls(stack: SimStack) -> int:
    """Requests every simulator has received since its last reset."""
    calls = 0
    for url in simulator_urls(stack):
        if url in {n.url for n in stack.nodes}:
            calls += len(sim_get(url, "/sim/records")["decodes"])
        else:
            calls += len(sim_get(url, "/sim/requests")["requests"])
    return calls


def post(
    gateway: GatewayProcess,
    content: bytes,
    *,
    path: str = "/chat/completions",
    content_type: str | None = "application/json",
) -> httpx.Response:
    headers = {"content-type": content_type} if content_type is not None else {}
    return plain().post(gateway.base_url + path, content=content, headers=headers, timeout=60)


def nested(depth: int) -> bytes:
    return b'{"model": "ds", "metadata": ' + b"[" * depth + b"]" * depth + b"}"


HOSTILE = [
    ("empty body", b"", None, 400, None),
    ("not json", b"{model: ds}", None, 400, None),
    ("json null", b"null", None, 400, None),
    ("a list", b"[1, 2]", None, 400, None),
    ("invalid utf-8", b'{"model": "\xff\xfe"}', None, 400, None),
    ("lone surrogate", b'{"model": "ds", "user": "\\ud800"}', None, 400, None),
    ("number past double", b'{"model": "ds", "max_tokens": 1e400}', None, 400, None),
    ("NaN literal", b'{"model": "ds", "temperature": NaN}', None, 400, None),
    ("nesting under orjson's limit", nested(600), None, 400, "limit_exceeded"),
    ("nesting over orjson's limit", nested(2000), None, 400, None),
    ("body over the limit", b'{"x": "' + b"a" * (5 * 1024 * 1024) + b'"}', None, 413, None),
    ("text/plain", orjson.dumps(CHAT), "text/plain", 400, "unsupported_media_type"),
    ("form", orjson.dumps(CHAT), "application/x-www-form-urlencoded", 400, None),
    ("unknown model", orjson.dumps({**CHAT, "model": "other"}), None, 404, "model_not_found"),
    ("model of 1 MB", orjson.dumps({**CHAT, "model": "m" * 1_000_000}), None, 404, None),
    ("stop x 100k", orjson.dumps({**CHAT, "stop": ["x"] * 100_000}), None, 400, "limit_exceeded"),
    (
        "messages x 10k",
        orjson.dumps({**CHAT, "messages": CHAT["messages"] * 10_000}),
        None,
        400,
        "limit_exceeded",
    ),
    ("max_tokens as a word", orjson.dumps({**CHAT, "max_tokens": "five"}), None, 400, None),
    ("max_tokens with a fraction", orjson.dumps({**CHAT, "max_tokens": "5.5"}), None, 400, None),
    ("max_tokens of 1M digits", orjson.dumps({**CHAT, "max_tokens": "9" * 10**6}), None, 400, None),
    ("temperature as text inf", orjson.dumps({**CHAT, "temperature": "inf"}), None, 400, None),
    ("stream as a word", orjson.dumps({**CHAT, "stream": "maybe"}), None, 400, None),
    ("max_tokens negative", orjson.dumps({**CHAT, "max_tokens": -1}), None, 400, None),
    ("max_tokens huge", orjson.dumps({**CHAT, "max_tokens": 2**62}), None, 400, None),
    ("logprobs huge", orjson.dumps({**CHAT, "logprobs": 2.4e15}), None, 400, None),
    ("top_logprobs alone", orjson.dumps({**CHAT, "top_logprobs": 3}), None, 400, None),
    ("penalty out of range", orjson.dumps({**CHAT, "presence_penalty": 9}), None, 400, None),
    (
        "role not text",
        orjson.dumps({**CHAT, "messages": [{"role": 5, "content": "y"}]}),
        None,
        400,
        None,
    ),
    (
        "role of 1 MB",
        orjson.dumps({**CHAT, "messages": [{"role": "r" * 10**6, "content": "y"}]}),
        None,
        400,
        None,
    ),
    ("max_tokens zero", orjson.dumps({**CHAT, "max_tokens": 0}), None, 400, None),
    (
        "tool without name",
        orjson.dumps({**CHAT, "tools": [{"type": "function", "function": {}}]}),
        None,
        400,
        None,
    ),
]
TOKEN_IDS = [
    ("negative token id", {"model": MODEL, "prompt": [-1]}),
    ("token id past the vocabulary", {"model": MODEL, "prompt": [5, 10**9]}),
    ("nested token ids", {"model": MODEL, "prompt": [[1], [2**40]]}),
    (
        "stop token id past the vocabulary",
        {"model": MODEL, "prompt": "x", "stop_token_ids": [10**9]},
    ),
]


@pytest.mark.parametrize(
    ("content", "content_type", "status", "code"),
    [case[1:] for case in HOSTILE],
    ids=[case[0] for case in HOSTILE],
)
def test_hostile_shapes_are_refused_without_touching_a_backend(
    gateway: GatewayProcess,
    stack: SimStack,
    content: bytes,
    content_type: str | None,
    status: int,
    code: str | None,
) -> None:
    reset(stack)
    response = post(gateway, content, content_type=content_type or "application/json")
    assert response.status_code == status, response.text[:300]
    error = response.json()["error"]
    assert error["type"] in GATEWAY_ERROR_TYPES and error["message"]
    if code is not None:
        assert error["code"] == code
    assert "x-request-id" in response.headers
    assert len(response.content) < 4096, "an error does not echo a hostile input back whole"
    assert backend_calls(stack) == 0


@pytest.mark.parametrize("body", [case[1] for case in TOKEN_IDS], ids=[c[0] for c in TOKEN_IDS])
def test_token_ids_outside_the_vocabulary_never_reach_a_backend(
    gateway: GatewayProcess, stack: SimStack, body: dict[str, Any]
) -> None:
    reset(stack)
    response = post(gateway, orjson.dumps(body), path="/completions")
    assert response.status_code == 400
    assert "vocabulary" in response.json()["error"]["message"]
    assert backend_calls(stack) == 0


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)
MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "bogus"]) | JSON},
        optional={"content": st.text(max_size=30) | JSON, "name": JSON},
    ),
    max_size=3,
)
ITEMS = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["message", "function_call", "function_call_output"]) | JSON,
            "role": st.sampled_from(["user", "assistant", "developer", "bogus"]) | JSON,
            "content": st.text(max_size=30)
            | st.lists(st.fixed_dictionaries({"type": st.just("input_text"), "text": JSON}))
            | JSON,
            "call_id": JSON,
            "name": JSON,
            "arguments": JSON,
            "output": JSON,
        },
    ),
    max_size=3,
)
FIELDS = {
    "messages": MESSAGES | JSON,
    "prompt": st.text(max_size=30) | st.lists(st.integers(-5, 200_000), max_size=4) | JSON,
    "max_tokens": st.integers(-3, 10) | JSON,
    "max_completion_tokens": st.integers(-3, 10) | JSON,
    "stream": st.booleans() | JSON,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | JSON,
    "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=40) | JSON,
    "stop_token_ids": st.lists(st.integers(-2, 200_000), max_size=3) | JSON,
    "temperature": st.floats(-1, 3) | JSON,
    "top_p": st.floats(-1, 2) | JSON,
    "top_k": st.integers(-3, 100) | JSON,
    "n": st.integers(-1, 200) | JSON,
    "logprobs": st.booleans() | st.integers(-1, 30) | JSON,
    "top_logprobs": st.integers(-1, 30) | JSON,
    "tools": JSON,
    "tool_choice": st.sampled_from(["auto", "none", "required"]) | JSON,
    "chat_template_kwargs": st.dictionaries(st.text(max_size=10), JSON, max_size=3) | JSON,
    "metadata": JSON,
    "kv_transfer_params": JSON,
    "vllm_xargs": JSON,
    "seed": st.integers(-(2**70), 2**70) | JSON,
    "logit_bias": JSON,
    # the Responses API's own
    "input": st.text(max_size=30) | ITEMS | JSON,
    "instructions": st.text(max_size=10) | JSON,
    "max_output_tokens": st.integers(-3, 10) | JSON,
    "text": st.fixed_dictionaries({"format": JSON}) | JSON,
    "reasoning": JSON,
    "include": st.lists(st.sampled_from(["message.output_text.logprobs", "x"])) | JSON,
    "store": st.booleans() | JSON,
    "previous_response_id": JSON,
}
BODIES = st.fixed_dictionaries(
    {"model": st.sampled_from([MODEL, "other", ""]) | JSON},
    optional=FIELDS,
)


def _as_number(value: Any) -> float:
    """`value` as the gateway may read a number (numeric text too); 0 if it is none."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return 0
    try:
        return float(value)
    except ValueError:
        return 0


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=BODIES, path=st.sampled_from(["/chat/completions", "/completions", "/responses"]))
def test_no_request_body_gets_a_5xx(
    gateway: GatewayProcess, stack: SimStack, body: dict[str, Any], path: str
) -> None:
    for budget in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if _as_number(body.get(budget)) > 8:
            body[budget] = 8  # keep accepted requests short
    before = backend_calls(stack)
    # json, not orjson: integers past 64 bits must reach the gateway as they are.
    response = post(gateway, json.dumps(body).encode(), path=path)
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        error = response.json()["error"]
        if error.get("type") in GATEWAY_ERROR_TYPES:
            assert backend_calls(stack) == before, "a refused request reached a backend"


def test_a_model_is_described_and_an_unsupported_endpoint_is_named_and_counted(
    gateway: GatewayProcess, stack: SimStack
) -> None:
    # As the native path's vLLM server describes it (the card of its served model).
    assert stack.proxy is not None
    [own] = plain().get(stack.proxy.url + "/v1/models", timeout=10).json()["data"]
    described = plain().get(gateway.base_url + "/models/" + MODEL, timeout=10).json()
    # vLLM names each permission anew on every call.
    permission = [{**own["permission"][0], "id": described["permission"][0]["id"]}]
    assert described == {
        **own,
        "id": MODEL,
        "created": described["created"],
        "permission": permission,
    }
    assert described["owned_by"] == "vllm"
    missing = plain().get(gateway.base_url + "/models/nope", timeout=10)
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "model_not_found")
    for _ in range(2):  # a stored response: the gateway keeps none
        refused = plain().get(gateway.base_url + "/responses/resp_1", timeout=10)
        assert refused.status_code == 404
        error = refused.json()["error"]
        assert error["code"] == "unsupported_endpoint"
        assert "GET /v1/responses/resp_1" in error["message"]
    metrics = plain().get(gateway.url + "/metrics", timeout=10).text
    assert 'pd_gateway_unsupported_requests_total{endpoint="responses"} 2.0' in metrics
