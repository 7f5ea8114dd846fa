"""Pull mode: prefill first, its opaque kv_transfer_params verbatim into the decode leg."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import httpx
import orjson
import pytest

from router.config import ConditionalConfig, PullConfig
from router.selection import PathSelection
from router.selection.request_keys import AffinityKeys
from router.serving import RoutedRequest
from router.throughput.factory import make_throughput_path
from router.throughput.pull import PullPath
from tests.support.legs import NIXL_PREFILL_PARAMS
from tests.throughput.support import made

from .support import RID, Upstreams, answer, asgi_client, events, failing, routed, sse

CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 5,
    "min_tokens": 2,
}
OPAQUE = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_engine_id": "p-engine",
    "remote_block_ids": [3, 4, 5],
    "remote_host": "10.0.0.1",
    "remote_port": 5600,
    "remote_request_id": "x",
    "tp_size": 1,
}


def prefill_answer(cached: int | None = 8, params: object = OPAQUE) -> dict:
    details = None if cached is None else {"cached_tokens": cached}
    return {
        "id": f"chatcmpl-{RID}",
        "choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 1, "prompt_tokens_details": details},
        "kv_transfer_params": params,
    }


def decode_answer(cached: int = 20) -> dict:
    return {
        "id": f"chatcmpl-{RID}",
        "choices": [{"index": 0, "message": {"content": "hello"}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": 20,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


def pull(up: Upstreams) -> PullPath:
    config = PullConfig(mode="pull", prefill=["http://p:8000"], decode=["http://d:8000"])
    return made(make_throughput_path(config, upstreams=up.pool()), PullPath)


async def test_legs_carry_the_protocol_bodies_and_one_request_id() -> None:
    up = Upstreams()
    up.on("p", answer(prefill_answer()))
    up.on("d", answer(decode_answer()))
    async with asgi_client(pull(up)) as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    prefill, decode = up.seen
    assert (prefill.host, decode.host) == ("p", "d")
    assert prefill.path == decode.path == "/v1/chat/completions"
    assert prefill.headers["x-request-id"] == decode.headers["x-request-id"] == RID
    assert prefill.body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": NIXL_PREFILL_PARAMS,
    }
    assert decode.body == {**CHAT, "kv_transfer_params": OPAQUE}


async def test_decode_answer_is_relayed_with_the_prefills_cached_tokens() -> None:
    up = Upstreams()
    up.on("p", answer(prefill_answer(cached=8)))
    up.on("d", answer(decode_answer(cached=20)))
    async with asgi_client(pull(up)) as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.json() == {**decode_answer(cached=8)}
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-pd-route"] == "throughput"


async def test_prefill_without_cache_report_counts_as_no_cache_hit() -> None:
    up = Upstreams()
    up.on("p", answer(prefill_answer(cached=None)))
    up.on("d", answer(decode_answer(cached=20)))
    async with asgi_client(pull(up)) as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


async def test_stream_is_relayed_with_only_the_usage_event_rewritten() -> None:
    chunks = [
        sse({"choices": [{"delta": {"content": "he"}}], "usage": None}),
        sse({"choices": [{"delta": {"content": "llo"}}], "usage": None}),
        sse({"choices": [], "usage": decode_answer(cached=20)["usage"]}),
        b"data: [DONE]\n\n",
    ]
    up = Upstreams()
    up.on("p", answer(prefill_answer(cached=8)))
    up.on("d", events(*chunks))
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    async with asgi_client(pull(up)) as client:
        response = await client.post("/v1/chat/completions", json=body)
    expected = [
        *chunks[:2],
        sse({"choices": [], "usage": decode_answer(cached=8)["usage"]}),
        chunks[3],
    ]
    assert response.content == b"".join(expected)
    assert response.headers["content-type"] == "text/event-stream"
    assert up.to("d")[0].body["stream_options"] == {"include_usage": True}
    assert "stream_options" not in up.to("p")[0].body


async def test_prefill_without_kv_params_lets_the_decode_compute_the_prompt() -> None:
    up = Upstreams()
    up.on("p", answer(prefill_answer(params=None)))
    up.on("d", answer(decode_answer()))
    async with asgi_client(pull(up)) as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert up.to("d")[0].body == CHAT


@pytest.mark.parametrize(
    ("leg", "status", "client_status"),
    [
        ("p", 400, 400),
        ("p", 500, 502),
        ("p", 503, 503),
        ("d", 422, 422),
        ("d", 500, 502),
        ("d", 504, 504),
    ],
)
async def test_error_status_from_either_leg(leg: str, status: int, client_status: int) -> None:
    up = Upstreams()
    up.on("p", answer(prefill_answer()))
    up.on("d", answer(decode_answer()))
    up.on(leg, answer({"error": {"message": "boom", "type": "X", "code": status}}, status=status))
    async with asgi_client(pull(up)) as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == client_status
    error = response.json()["error"]
    name = "prefill" if leg == "p" else "decode"
    if status < 500:  # the client's own request refused: the upstream's body as it came
        assert error == {"message": "boom", "type": "X", "code": status}
    else:
        assert error["message"] == f"the {name} server answered {status}: boom"
        assert error["code"] == f"{name}_failed"
    assert response.headers["x-pd-route"] == "throughput"
    assert [s.host for s in up.seen] == (["p"] if leg == "p" else ["p", "d"])


@pytest.mark.parametrize(
    ("leg", "exc", "client_status", "code"),
    [
        ("p", httpx.ConnectError("refused"), 502, "prefill_unreachable"),
        ("p", httpx.ReadTimeout("slow"), 504, "prefill_timeout"),
        ("d", httpx.ConnectError("refused"), 502, "decode_unreachable"),
        ("d", httpx.ReadTimeout("slow"), 504, "decode_timeout"),
    ],
)
async def test_transport_failure_of_either_leg(
    leg: str, exc: Exception, client_status: int, code: str
) -> None:
    up = Upstreams()
    up.on("p", answer(prefill_answer()))
    up.on("d", answer(decode_answer()))
    up.on(leg, failing(exc))
    async with asgi_client(pull(up)) as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == client_status
    assert response.json()["error"]["code"] == code


async def test_prefill_answer_that_is_not_json_is_a_502() -> None:
    async def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"<html>", headers={"content-type": "text/html"})

    up = Upstreams()
    up.on("p", handle)
    async with asgi_client(pull(up)) as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 502
    assert "prefill server" in response.json()["error"]["message"]
    assert up.to("d") == []


async def test_decode_failure_mid_stream_is_an_error_event() -> None:
    up = Upstreams()
    up.on("p", answer(prefill_answer()))
    up.on("d", events(sse({"choices": []}), then=httpx.RemoteProtocolError("closed")))
    async with asgi_client(pull(up)) as client:
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    first, second, done, end = response.content.split(b"\n\n")
    assert first + b"\n\n" == sse({"choices": []})
    assert orjson.loads(second[len(b"data: ") :])["error"]["code"] == "decode_failed"
    assert (done, end) == (b"data: [DONE]", b"")


SCORING = {
    "completion echo with logprobs": (
        "/v1/completions",
        {"model": "m", "prompt": "hi there", "echo": True, "logprobs": 1, "max_tokens": 0},
    ),
    "chat prompt_logprobs": ("/v1/chat/completions", {**CHAT, "prompt_logprobs": 1}),
}


@pytest.mark.parametrize("case", SCORING)
async def test_a_request_scoring_its_prompt_is_served_whole_by_the_decode(case: str) -> None:
    """Only the server that computes a prompt can give its logprobs: no prefill leg."""
    path, body = SCORING[case]
    up = Upstreams()
    up.on("d", answer(decode_answer()))
    async with asgi_client(pull(up)) as client:
        response = await client.post(path, json=body)
    assert response.status_code == 200
    (decode,) = up.seen
    assert (decode.host, decode.path, decode.body) == ("d", path, body)


async def test_an_echo_without_logprobs_is_split_as_usual() -> None:
    up = Upstreams()
    up.on("p", answer(prefill_answer()))
    up.on("d", answer(decode_answer()))
    body = {"model": "m", "prompt": "hi there", "echo": True, "max_tokens": 3}
    async with asgi_client(pull(up)) as client:
        response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200
    assert [seen.host for seen in up.seen] == ["p", "d"]


def pull_over(up: Upstreams, prefill: list[str], decode: list[str]) -> PullPath:
    config = PullConfig(
        mode="pull",
        prefill=[f"http://{h}:8000" for h in prefill],
        decode=[f"http://{h}:8000" for h in decode],
    )
    return made(make_throughput_path(config, upstreams=up.pool()), PullPath)


@pytest.mark.parametrize("leg", ["prefill", "decode"])
async def test_a_leg_whose_server_refused_goes_to_the_other(leg: str) -> None:
    up = Upstreams()
    refused = failing(httpx.ConnectError("refused"))
    up.on("p1", refused if leg == "prefill" else answer(prefill_answer()))
    up.on("p2", answer(prefill_answer()))
    up.on("d1", refused if leg == "decode" else answer(decode_answer()))
    up.on("d2", answer(decode_answer()))
    async with asgi_client(pull_over(up, ["p1", "p2"], ["d1", "d2"])) as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "hello"
    hosts = [seen.host for seen in up.seen]
    assert hosts == (["p1", "p2", "d1"] if leg == "prefill" else ["p1", "d1", "d2"])


async def test_a_prefill_that_timed_out_is_not_sent_again() -> None:
    up = Upstreams()
    up.on("p1", failing(httpx.ReadTimeout("slow")))
    up.on("p2", answer(prefill_answer()))
    up.on("d1", answer(decode_answer()))
    async with asgi_client(pull_over(up, ["p1", "p2"], ["d1"])) as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.json()["error"]["code"] == "prefill_timeout"
    assert [seen.host for seen in up.seen] == ["p1"]


async def test_the_access_record_names_the_decode_and_the_prefill() -> None:
    up = Upstreams()
    up.on("p", answer(prefill_answer()))
    up.on("d1", answer(decode_answer()))
    up.on("d2", answer(decode_answer()))
    path = pull_over(up, ["p"], ["d1", "d2"])
    request = routed(CHAT)
    async with AsyncExitStack() as stack:
        await path.open(request, stack)
    access = request.access
    assert (access.prefill, access.upstream, access.upstream_reason) == (
        "http://p:8000",
        "http://d1:8000",
        "rotation",
    )


def conditional_pull(up: Upstreams, **conditional: int) -> PullPath:
    """Pull over one prefill and one decode server, with a prefix index whose token ids
    are the prompt's characters, serving whole by `conditional`."""
    config = PullConfig(
        mode="pull",
        prefill=["http://p:8000"],
        decode=["http://d:8000"],
        conditional=ConditionalConfig(**conditional),
    )
    selection = PathSelection(AffinityKeys(lambda endpoint, body: prompt_chars(body)))
    return made(make_throughput_path(config, upstreams=up.pool(), selection=selection), PullPath)


def prompt_chars(body: dict[str, Any]) -> list[int]:
    return [ord(c) for c in body["messages"][0]["content"]]


def asking(text: str) -> dict[str, Any]:
    return {**CHAT, "messages": [{"role": "user", "content": text}]}


def both_answer(up: Upstreams) -> None:
    up.on("p", answer(prefill_answer()))
    up.on("d", answer(decode_answer()))


async def served(path: PullPath, body: dict[str, Any]) -> RoutedRequest:
    request = routed(body)
    async with AsyncExitStack() as stack:
        await path.open(request, stack)
    return request


LONG = "a long prompt, well over the few tokens a split must save " * 4  # 232 tokens


async def test_a_prompt_with_few_uncached_tokens_is_served_whole_on_the_decode() -> None:
    up = Upstreams()
    both_answer(up)
    path = conditional_pull(up, min_uncached_tokens=64)
    short = await served(path, asking("a short question"))
    assert [seen.host for seen in up.seen] == ["d"]
    assert up.seen[0].body == asking("a short question")  # the client's body, whole
    assert (short.access.native_way, short.access.native_way_reason) == ("whole", "cached")
    long = await served(path, asking(LONG))
    assert [seen.host for seen in up.seen] == ["d", "p", "d"]
    assert (long.access.native_way, long.access.native_way_reason) == ("split", "uncached")


async def test_a_prompt_the_decode_server_holds_is_served_whole_there() -> None:
    """Its second turn: all but the last partial block was sent to that decode server."""
    up = Upstreams()
    both_answer(up)
    path = conditional_pull(up, min_uncached_tokens=15)
    first = await served(path, asking(LONG))
    again = await served(path, asking(LONG))
    assert [seen.host for seen in up.seen] == ["p", "d", "d"]
    assert first.access.native_way == "split"
    assert (again.access.native_way, again.access.native_way_reason) == ("whole", "cached")


async def test_busy_prefill_servers_send_the_request_whole_to_the_decode() -> None:
    up = Upstreams()
    both_answer(up)
    path = conditional_pull(up, min_uncached_tokens=0, prefill_busier_by=2)
    (prefill_set, decode_set) = path.server_sets()
    with prefill_set.hold("http://p:8000"):
        assert (await served(path, asking(LONG))).access.native_way == "split"
        with prefill_set.hold("http://p:8000"), decode_set.hold("http://d:8000"):
            assert (await served(path, asking(LONG))).access.native_way == "split"  # 2 - 1
        with prefill_set.hold("http://p:8000"):
            busy = await served(path, asking(LONG))
    assert (busy.access.native_way, busy.access.native_way_reason) == ("whole", "prefill_busy")
    assert [seen.host for seen in up.seen] == ["p", "d", "p", "d", "d"]


async def test_without_conditional_every_request_is_split() -> None:
    up = Upstreams()
    both_answer(up)
    request = await served(pull(up), asking("a short question"))
    assert [seen.host for seen in up.seen] == ["p", "d"]
    assert (request.access.native_way, request.access.native_way_reason) == ("split", "always")
