"""Proxy mode: the request goes out as sent, the answer comes back byte for byte."""

from __future__ import annotations

import httpx
import orjson
import pytest

from router.config import ProxyConfig
from router.serving import RoutedRequest
from router.throughput.factory import make_throughput_path
from router.throughput.proxy import ProxyPath
from tests.throughput.support import made

from .support import RID, Upstreams, answer, asgi_client, balancers, events, failing, sse

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def proxy(upstreams: Upstreams, *hosts: str) -> ProxyPath:
    config = ProxyConfig(mode="proxy", urls=[f"http://{h}:8000" for h in hosts or ("px",)])
    return made(make_throughput_path(config, upstreams=upstreams.pool()), ProxyPath)


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/completions", {"model": "m", "prompt": "x", "stream": True, "min_tokens": 2}),
    ],
)
async def test_request_goes_out_unchanged_with_the_request_id(endpoint: str, body: dict) -> None:
    up = Upstreams()
    up.on("px", answer({"ok": True}))
    async with asgi_client(proxy(up)) as client:
        await client.post(endpoint, json=body)
    (seen,) = up.seen
    # A stream is asked for its usage, for the gateway's counts (router/throughput/stream_usage.py).
    usage = {"stream_options": {"include_usage": True}} if body.get("stream") else {}
    assert (seen.path, seen.body) == (endpoint, {**body, **usage})
    assert seen.headers["x-request-id"] == RID
    assert seen.headers["content-type"] == "application/json"


async def test_json_answer_is_relayed_byte_for_byte_with_its_headers() -> None:
    raw = b'{"id":"chatcmpl-1",  "odd spacing": [1, 2]}'

    async def handle(request: httpx.Request) -> httpx.Response:
        headers = {
            "content-type": "application/json; charset=utf-8",
            "x-upstream": "yes",
            "connection": "keep-alive, x-hop",
            "keep-alive": "timeout=5",
            "x-hop": "named by Connection, so hop-by-hop",
            "x-pd-route": "spoofed",
        }
        return httpx.Response(200, content=raw, headers=headers)

    up = Upstreams()
    up.on("px", handle)
    async with asgi_client(proxy(up)) as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.content == raw
    assert response.headers["content-type"] == "application/json; charset=utf-8"
    assert response.headers["x-upstream"] == "yes"
    assert "keep-alive" not in response.headers
    assert "x-hop" not in response.headers
    assert response.headers.get_list("x-pd-route") == ["throughput"]
    assert response.headers["x-pd-rule"] == "batch"


async def test_event_stream_is_relayed_byte_for_byte() -> None:
    chunks = [sse({"a": 1})[:7], sse({"a": 1})[7:] + sse({"b": 2}), b"data: [DONE]\n\n"]
    up = Upstreams()
    up.on("px", events(*chunks))
    async with asgi_client(proxy(up)) as client:
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    assert response.content == b"".join(chunks)


@pytest.mark.parametrize("status", [400, 404, 429, 500, 503])
async def test_upstream_error_status_and_body_pass_through(status: int) -> None:
    error = {"error": {"message": "nope", "type": "BadRequestError", "param": None, "code": status}}
    up = Upstreams()
    up.on("px", answer(error, status=status))
    async with asgi_client(proxy(up)) as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == status
    assert response.content == orjson.dumps(error)
    assert response.headers["x-pd-route"] == "throughput"


@pytest.mark.parametrize("status", [204, 205, 304])
async def test_an_answer_without_a_body_is_the_proxys_failure(status: int) -> None:
    async def bodiless(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status)

    up = Upstreams()
    up.on("px", bodiless)
    path = proxy(up, "px")
    served: list[RoutedRequest] = []
    async with asgi_client(path, served=served) as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 502
    assert (served[0].access.status, served[0].access.error_code) == (502, "proxy_failed")
    assert response.json()["error"] == {
        "message": f"the disaggregation proxy answered {status}, without a body, to a"
        " generation request",
        "type": "upstream_error",
        "param": None,
        "code": "proxy_failed",
    }
    assert path.server_sets()[0].snapshot()["http://px:8000"]["failures"] == 1


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (httpx.ConnectError("refused"), 502, "proxy_unreachable"),
        (httpx.ConnectTimeout("slow"), 502, "proxy_unreachable"),
        (httpx.ReadTimeout("slow"), 504, "proxy_timeout"),
        (httpx.RemoteProtocolError("garbage"), 502, "proxy_failed"),
    ],
)
async def test_transport_failures_become_gateway_errors(
    exc: Exception, status: int, code: str
) -> None:
    up = Upstreams()
    up.on("px", failing(exc))
    async with asgi_client(proxy(up)) as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code
    assert "the disaggregation proxy" in error["message"]
    assert response.headers["x-pd-route"] == "throughput"


async def test_failure_mid_stream_ends_with_an_error_event_on_an_event_boundary() -> None:
    up = Upstreams()
    up.on("px", events(sse({"a": 1}), b'data: {"trunc', then=httpx.ReadError("reset")))
    async with asgi_client(proxy(up)) as client:
        # Asked for usage by the client: relayed unfiltered, the half event included.
        streamed = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
        response = await client.post("/v1/chat/completions", json=streamed)
    assert response.status_code == 200
    head, tail = response.content.split(b'data: {"trunc')
    assert head == sse({"a": 1})
    assert tail.startswith(b"\n\ndata: ")
    error_event, done = tail.strip().split(b"\n\n")
    assert done == b"data: [DONE]", "the stream still ends as OpenAI streams end"
    error = orjson.loads(error_event[len(b"data: ") :])["error"]
    assert error["code"] == "proxy_failed"
    assert "mid-stream" in error["message"]


async def test_requests_go_to_the_least_busy_url_and_are_released() -> None:
    up = Upstreams()
    for host in ("a", "b"):
        up.on(host, answer({"host": host}))
    path = proxy(up, "a", "b")
    async with asgi_client(path) as client:
        hosts = [(await client.post("/v1/completions", json=CHAT)).json()["host"] for _ in range(4)]
    assert sorted(hosts) == ["a", "a", "b", "b"]
    assert balancers(path) == {"proxy": {"http://a:8000": 0, "http://b:8000": 0}}


async def test_an_unreachable_proxy_is_tried_once_and_the_other_answers() -> None:
    up = Upstreams()
    up.on("a", failing(httpx.ConnectError("refused")))
    up.on("b", answer({"host": "b"}))
    path = proxy(up, "a", "b")
    async with asgi_client(path) as client:
        replies = [await client.post("/v1/completions", json=CHAT) for _ in range(12)]
    assert [r.json()["host"] for r in replies] == ["b"] * 12
    # Every other request chose `a` and was sent again; five refusals ejected it.
    assert len(up.to("a")) == 5 and len(up.to("b")) == 12
    assert path.server_sets()[0].snapshot()["http://a:8000"]["state"] == "ejected"


async def test_a_proxy_that_timed_out_is_not_asked_again() -> None:
    up = Upstreams()
    up.on("a", failing(httpx.ReadTimeout("slow")))
    up.on("b", answer({"host": "b"}))
    async with asgi_client(proxy(up, "a", "b")) as client:
        response = await client.post("/v1/completions", json=CHAT)
    assert response.json()["error"]["code"] == "proxy_timeout"
    assert up.to("b") == []


async def test_a_relayed_server_error_counts_against_the_proxy() -> None:
    up = Upstreams()
    up.on("px", answer({"error": {"message": "engine dead"}}, status=500))
    path = proxy(up, "px")
    async with asgi_client(path) as client:
        response = await client.post("/v1/completions", json=CHAT)
    assert response.status_code == 500
    assert path.server_sets()[0].snapshot()["http://px:8000"]["failures"] == 1
