"""Every throughput mode against the vLLM simulators running as real processes.

The simulators record what they received (`/sim/requests`), so the legs are checked as the
upstream saw them. A `both`-role simulator stands in for the native disaggregation proxy.
Only the `created` field differs between two otherwise identical answers (it is the
server's clock), so it alone is masked when answers are compared byte for byte.
"""

from __future__ import annotations

import re
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from router.config import PrefillEngineConfig, ProxyConfig, PullConfig, PushConfig, UpstreamsConfig
from router.serving import RoutedRequest, ServePath
from router.throughput import make_throughput_path
from router.upstream import Upstreams
from sim.stack import SimStack
from tests.support.legs import nixl_prefill_body, pull_decode_params, push_decode_params
from tests.support.stacks import StackPool

from .support import TIMEOUTS, app_for, asgi_client, in_flight, serving, wait_until

pytestmark = pytest.mark.e2e

MODEL = "sim-model"
TEXT = "naïve 日本語 🙂 done"
CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": f"[[sim-output]]{TEXT}[[/sim-output]]"}],
    "max_tokens": 50,
}
COMPLETION = {"model": MODEL, "prompt": f"[[sim-output]]{TEXT}[[/sim-output]]", "max_tokens": 50}
STREAM = {"stream": True, "stream_options": {"include_usage": True}}
CASES = [
    ("/v1/chat/completions", CHAT),
    ("/v1/chat/completions", {**CHAT, **STREAM}),
    ("/v1/completions", COMPLETION),
    ("/v1/completions", {**COMPLETION, **STREAM}),
]


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    # A prefill slow enough (1 ms per prompt token) that push-mode overlap is visible, and
    # decoding slow enough (10 ms per token) that a long answer outlasts a disconnect test.
    return sim_stacks.get(
        nodes=0,
        prefills=1,
        decodes=1,
        proxy=True,
        prefill_args=["--itl-ms", "0", "--prefill-ms-per-token", "1"],
        decode_args=["--itl-ms", "10", "--prefill-ms-per-token", "0"],
        proxy_args=["--itl-ms", "10", "--prefill-ms-per-token", "0"],
    )


@pytest.fixture
async def http(stack: SimStack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as client:
        for server in (*stack.prefills, *stack.decodes, stack.proxy):
            assert server is not None
            await client.delete(f"{server.url}/sim/faults")
            await client.post(f"{server.url}/sim/reset")
        yield client


@pytest.fixture
async def upstreams() -> AsyncIterator[Upstreams]:
    clients = Upstreams(UpstreamsConfig(), TIMEOUTS)
    yield clients
    await clients.aclose()


def paths(stack: SimStack, upstreams: Upstreams) -> dict[str, ServePath]:
    prefill, decode, proxy = stack.prefills[0], stack.decodes[0], stack.proxy
    assert proxy is not None
    engine = PrefillEngineConfig(
        url=prefill.url,
        engine_id=prefill.engine_id,
        side_channel_host=prefill.side_channel_host,
        side_channel_port=prefill.side_channel_port,
    )
    configs = {
        "proxy": ProxyConfig(mode="proxy", urls=[proxy.url]),
        "pull": PullConfig(mode="pull", prefill=[prefill.url], decode=[decode.url]),
        "push": PushConfig(mode="push", prefill=[engine], decode=[decode.url]),
    }
    return {
        mode: make_throughput_path(config, upstreams=upstreams) for mode, config in configs.items()
    }


def masked(content: bytes) -> bytes:
    return re.sub(rb'"created":\d+', b'"created":0', content)


async def seen(http: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    return (await http.get(f"{url}/sim/requests")).json()["requests"]


async def direct(http: httpx.AsyncClient, stack: SimStack, endpoint: str, body: dict, rid: str):
    assert stack.proxy is not None
    return await http.post(stack.proxy.url + endpoint, json=body, headers={"x-request-id": rid})


@pytest.mark.parametrize("mode", ["proxy", "pull", "push"])
@pytest.mark.parametrize(("endpoint", "body"), CASES)
async def test_answer_equals_the_native_servers_own(
    stack: SimStack,
    http: httpx.AsyncClient,
    upstreams: Upstreams,
    mode: str,
    endpoint: str,
    body: dict,
) -> None:
    rid = uuid.uuid4().hex
    expected = await direct(http, stack, endpoint, body, rid)
    async with asgi_client(paths(stack, upstreams)[mode], request_id=rid) as gateway:
        answer = await gateway.post(endpoint, json=body)
    assert (answer.status_code, expected.status_code) == (200, 200)
    assert answer.headers["content-type"] == expected.headers["content-type"]
    assert masked(answer.content) == masked(expected.content)
    assert answer.headers["x-pd-route"] == "throughput"


@pytest.mark.parametrize("mode", ["proxy", "pull", "push"])
@pytest.mark.parametrize(
    ("endpoint", "body"),
    [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)],
    ids=["chat", "completions"],
)
async def test_a_stream_without_usage_is_counted_and_sent_as_asked(
    stack: SimStack,
    http: httpx.AsyncClient,
    upstreams: Upstreams,
    mode: str,
    endpoint: str,
    body: dict,
) -> None:
    rid = uuid.uuid4().hex
    streamed = {**body, "stream": True}
    expected = await direct(http, stack, endpoint, streamed, rid)
    with_usage = await direct(http, stack, endpoint, {**streamed, **STREAM}, rid)
    served: list[RoutedRequest] = []
    async with asgi_client(paths(stack, upstreams)[mode], request_id=rid, served=served) as gw:
        answer = await gw.post(endpoint, json=streamed)
    assert answer.status_code == 200
    assert b'"usage"' not in answer.content
    assert masked(answer.content) == masked(expected.content)
    events = [e for e in with_usage.content.split(b"\n\n") if e.startswith(b"data: {")]
    usage = orjson.loads(events[-1][len(b"data: ") :])["usage"]
    [request] = served
    access = request.access
    assert (access.prompt_tokens, access.completion_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    decode = stack.proxy if mode == "proxy" else stack.decodes[0]
    assert decode is not None
    last = (await seen(http, decode.url))[-1]
    assert last["body"]["stream_options"] == {"include_usage": True}


async def test_proxy_passes_an_upstream_4xx_through_byte_for_byte(
    stack: SimStack, http: httpx.AsyncClient, upstreams: Upstreams
) -> None:
    rid = uuid.uuid4().hex
    body = {**CHAT, "model": "no-such-model"}
    expected = await direct(http, stack, "/v1/chat/completions", body, rid)
    async with asgi_client(paths(stack, upstreams)["proxy"], request_id=rid) as gateway:
        answer = await gateway.post("/v1/chat/completions", json=body)
    assert answer.status_code == expected.status_code == 404
    assert answer.content == expected.content


async def test_a_proxied_error_names_its_type_in_the_access_record(
    stack: SimStack, upstreams: Upstreams
) -> None:
    served: list[RoutedRequest] = []
    body = {**CHAT, "model": "no-such-model"}
    async with asgi_client(paths(stack, upstreams)["proxy"], served=served) as gateway:
        answer = await gateway.post("/v1/chat/completions", json=body)
    assert answer.status_code == 404
    assert answer.json()["error"]["type"] == "NotFoundError"
    [request] = served
    assert request.access.error_code == "NotFoundError"


async def test_pull_legs_as_the_protocol_requires(
    stack: SimStack, http: httpx.AsyncClient, upstreams: Upstreams
) -> None:
    rid = uuid.uuid4().hex
    body = {**CHAT, **STREAM, "min_tokens": 2}
    async with asgi_client(paths(stack, upstreams)["pull"], request_id=rid) as gateway:
        answer = await gateway.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200
    (prefill,) = await seen(http, stack.prefills[0].url)
    (decode,) = await seen(http, stack.decodes[0].url)
    assert prefill["headers"]["x-request-id"] == decode["headers"]["x-request-id"] == rid
    assert prefill["body"] == nixl_prefill_body(CHAT)
    assert prefill["kv_mode"] == "nixl_producer"
    # The decode leg carries exactly what the prefill returned (the simulator's producer
    # parameters for this prompt), and reads the KV state over the side channel.
    server = stack.prefills[0]
    prompt = usage_of(answer.content)["prompt_tokens"]
    assert decode["body"] == {**body, "kv_transfer_params": pull_decode_params(server, rid, prompt)}
    assert decode["kv_mode"] == "nixl_consumer_pull"
    sides = (await http.get(f"{server.url}/sim/requests")).json()["side_channel"]
    assert [(s["remote_request_id"], s["outcome"]) for s in sides] == [(rid, "read")]


async def test_push_legs_overlap_and_name_the_prefill_engine(
    stack: SimStack, http: httpx.AsyncClient, upstreams: Upstreams
) -> None:
    rid = uuid.uuid4().hex
    # A longer prompt: its prefill takes long enough for the decode leg to arrive first.
    padding = " ".join(["filler"] * 400)
    body = {**COMPLETION, "prompt": f"{padding} {COMPLETION['prompt']}"}
    async with asgi_client(paths(stack, upstreams)["push"], request_id=rid) as gateway:
        answer = await gateway.post("/v1/completions", json=body)
    assert answer.status_code == 200
    assert answer.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    (prefill,) = await seen(http, stack.prefills[0].url)
    (decode,) = await seen(http, stack.decodes[0].url)
    server = stack.prefills[0]
    assert prefill["headers"]["x-request-id"] == decode["headers"]["x-request-id"] == rid
    assert prefill["body"] == nixl_prefill_body(body)
    assert decode["body"] == {**body, "kv_transfer_params": push_decode_params(server, rid)}
    assert decode["kv_mode"] == "nixl_consumer_push"
    assert decode["received"] < prefill["finished"], "the decode leg waited for the prefill"


@pytest.mark.parametrize(
    ("mode", "target", "fault", "status", "leg"),
    [
        ("pull", "prefill", {"http_status": 503}, 503, "prefill"),
        ("pull", "prefill", {"http_status": 500}, 502, "prefill"),
        ("pull", "decode", {"http_status": 400}, 400, "decode"),
        ("pull", "decode", {"pull_fail": True}, 502, "decode"),
        ("push", "prefill", {"http_status": 500}, 502, "prefill"),
        ("push", "decode", {"http_status": 429}, 429, "decode"),
        ("push", "decode", {"pull_fail": True}, 502, "decode"),
    ],
)
async def test_upstream_error_status_is_mapped_and_names_the_leg(
    stack: SimStack,
    http: httpx.AsyncClient,
    upstreams: Upstreams,
    mode: str,
    target: str,
    fault: dict,
    status: int,
    leg: str,
) -> None:
    server = stack.prefills[0] if target == "prefill" else stack.decodes[0]
    await http.post(f"{server.url}/sim/faults", json={**fault, "count": 1})
    async with asgi_client(paths(stack, upstreams)[mode], request_id=uuid.uuid4().hex) as gateway:
        answer = await gateway.post("/v1/chat/completions", json=CHAT)
    assert answer.status_code == status
    error = answer.json()["error"]
    if status < 500:  # the client's own request refused: the upstream's body as it came
        assert error["code"] == status and error["type"].endswith("Error")
    else:
        assert error["message"].startswith(f"the {leg} server answered ")
        assert error["code"] == f"{leg}_failed"
    assert answer.headers["x-pd-route"] == "throughput"


@pytest.mark.parametrize("mode", ["proxy", "pull", "push"])
async def test_connection_refused_is_a_502(mode: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    engine = PrefillEngineConfig(
        url=closed, engine_id="e", side_channel_host="127.0.0.1", side_channel_port=1
    )
    config = {
        "proxy": ProxyConfig(mode="proxy", urls=[closed]),
        "pull": PullConfig(mode="pull", prefill=[closed], decode=[closed]),
        "push": PushConfig(mode="push", prefill=[engine], decode=[closed]),
    }[mode]
    clients = Upstreams(UpstreamsConfig(), TIMEOUTS)
    path = make_throughput_path(config, upstreams=clients)
    async with asgi_client(path) as gateway:
        answer = await gateway.post("/v1/chat/completions", json=CHAT)
    await clients.aclose()
    assert answer.status_code == 502
    assert answer.json()["error"]["code"].endswith("_unreachable")


@pytest.mark.parametrize("mode", ["proxy", "pull", "push"])
async def test_upstream_death_mid_stream_is_an_error_event(
    stack: SimStack, http: httpx.AsyncClient, upstreams: Upstreams, mode: str
) -> None:
    server = stack.proxy if mode == "proxy" else stack.decodes[0]
    assert server is not None
    await http.post(f"{server.url}/sim/faults", json={"die_after": 3, "count": 1})
    body = {**CHAT, **STREAM}
    async with asgi_client(paths(stack, upstreams)[mode], request_id=uuid.uuid4().hex) as gateway:
        answer = await gateway.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200
    events = answer.content.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""], "an error event, then the end marker"
    assert len(events) == 6
    assert all(orjson.loads(e[6:])["object"] == "chat.completion.chunk" for e in events[:3])
    error = orjson.loads(events[3][len(b"data: ") :])["error"]
    assert error["code"] == f"{'proxy' if mode == 'proxy' else 'decode'}_failed"


@pytest.mark.parametrize("mode", ["proxy", "pull", "push"])
async def test_client_disconnect_mid_stream_aborts_the_upstream_stream(
    stack: SimStack, http: httpx.AsyncClient, upstreams: Upstreams, mode: str
) -> None:
    server = stack.proxy if mode == "proxy" else stack.decodes[0]
    assert server is not None
    # About 500 output tokens at 10 ms each: far longer than the test.
    words = " ".join(["word"] * 500)
    body = {**CHAT, **STREAM, "max_tokens": 1000}
    body["messages"] = [{"role": "user", "content": f"[[sim-output]]{words}[[/sim-output]]"}]
    path = paths(stack, upstreams)[mode]
    async with serving(app_for(path, request_id=uuid.uuid4().hex)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                assert (await anext(response.aiter_raw())).startswith(b"data: ")
        await wait_until(lambda: in_flight(path) == 0, what="upstream streams closed")
    generation = [r for r in await seen(http, server.url) if r["body"].get("stream")]
    assert len(generation) == 1
    assert generation[0]["finished"] is None, "the upstream stream was cut, not completed"


def usage_of(content: bytes) -> dict[str, Any]:
    for event in content.split(b"\n\n"):
        if event.startswith(b"data: {") and b'"usage":{' in event:
            return orjson.loads(event[len(b"data: ") :])["usage"]
    raise AssertionError("no usage event in the stream")
