"""Push mode: decode chosen first, both legs at once, a failing leg cancels the other."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from router.config import ConditionalConfig, PrefillEngineConfig, PushConfig
from router.throughput.factory import make_throughput_path
from router.throughput.push import PushPath
from tests.throughput.support import made

from .support import RID, Upstreams, answer, asgi_client, balancers, events, failing, sse

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
ENGINES = [
    PrefillEngineConfig(
        url="http://p0:8000",
        engine_id="engine-p0",
        side_channel_host="10.0.0.10",
        side_channel_port=5600,
        tp_size=8,
    ),
    PrefillEngineConfig(
        url="http://p1:8000",
        engine_id="engine-p1",
        side_channel_host="10.0.0.11",
        side_channel_port=5601,
        tp_size=8,
    ),
]
PREFILL_ANSWER = {
    "id": "x",
    "choices": [{"index": 0, "text": "a", "finish_reason": "length"}],
    "usage": {"prompt_tokens": 30, "prompt_tokens_details": {"cached_tokens": 12}},
    "kv_transfer_params": {"ignored": "in push mode"},
}
DECODE_ANSWER = {
    "id": "x",
    "choices": [{"index": 0, "text": "abc", "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 30, "prompt_tokens_details": {"cached_tokens": 30}},
}
ERROR = {"error": {"message": "boom", "type": "X", "code": 500}}


def push(up: Upstreams, engines: list[PrefillEngineConfig] = ENGINES[:1]) -> PushPath:
    config = PushConfig(mode="push", prefill=engines, decode=["http://d:8000"])
    return made(make_throughput_path(config, upstreams=up.pool()), PushPath)


async def test_decode_leg_carries_the_engines_coordinates_and_the_shared_id() -> None:
    up = Upstreams()
    up.on("p0", answer(PREFILL_ANSWER))
    up.on("d", answer(DECODE_ANSWER))
    async with asgi_client(push(up)) as client:
        response = await client.post("/v1/completions", json=CHAT)
    assert response.status_code == 200
    (prefill,) = up.to("p0")
    (decode,) = up.to("d")
    assert prefill.headers["x-request-id"] == decode.headers["x-request-id"] == RID
    assert prefill.body["kv_transfer_params"]["do_remote_decode"] is True
    assert (prefill.body["max_tokens"], prefill.body["stream"]) == (1, False)
    assert decode.body == {
        **CHAT,
        "kv_transfer_params": {
            "do_remote_decode": False,
            "do_remote_prefill": True,
            "remote_engine_id": "engine-p0",
            "remote_host": "10.0.0.10",
            "remote_port": 5600,
            "tp_size": 8,
            "pp_size": 1,
            "remote_request_id": RID,
        },
    }
    usage = response.json()["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 12}


async def test_decode_leg_is_sent_while_the_prefill_is_still_running() -> None:
    decode_arrived = asyncio.Event()

    async def prefill(request: httpx.Request) -> httpx.Response:
        # Answers only once the decode leg has arrived: a sequential implementation fails.
        try:
            await asyncio.wait_for(decode_arrived.wait(), timeout=5)
        except TimeoutError:
            return httpx.Response(500, json=ERROR)
        return httpx.Response(200, json=PREFILL_ANSWER)

    async def decode(request: httpx.Request) -> httpx.Response:
        decode_arrived.set()
        return await events(sse(DECODE_ANSWER), b"data: [DONE]\n\n")(request)

    up = Upstreams()
    up.on("p0", prefill)
    up.on("d", decode)
    async with asgi_client(push(up)) as client:
        response = await client.post("/v1/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200
    assert response.content.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("failing", ["p0", "d"])
async def test_a_failing_leg_cancels_the_other(failing: str) -> None:
    other_started, other_cancelled = asyncio.Event(), asyncio.Event()

    async def hang(request: httpx.Request) -> httpx.Response:
        other_started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            other_cancelled.set()
            raise
        raise AssertionError("unreachable")

    async def fail(request: httpx.Request) -> httpx.Response:
        await other_started.wait()
        return httpx.Response(500, json=ERROR)

    up = Upstreams()
    up.on("p0", hang)
    up.on("d", hang)
    up.on(failing, fail)
    async with asgi_client(push(up)) as client:
        response = await client.post("/v1/completions", json=CHAT)
    assert response.status_code == 502
    leg = "prefill" if failing == "p0" else "decode"
    assert response.json()["error"]["message"] == f"the {leg} server answered 500: boom"
    assert other_cancelled.is_set()


async def test_engines_are_balanced_and_released() -> None:
    up = Upstreams()
    up.on("p0", answer(PREFILL_ANSWER))
    up.on("p1", answer(PREFILL_ANSWER))
    up.on("d", answer(DECODE_ANSWER))
    path = push(up, ENGINES)
    async with asgi_client(path) as client:
        for _ in range(4):
            assert (await client.post("/v1/completions", json=CHAT)).status_code == 200
    engine_ids = sorted(s.body["kv_transfer_params"]["remote_engine_id"] for s in up.to("d"))
    assert engine_ids == ["engine-p0", "engine-p0", "engine-p1", "engine-p1"]
    # Requests ran one after another, so the records pair up: the engine named in each
    # decode leg is the one its prefill leg went to.
    for pair in (up.seen[i : i + 2] for i in range(0, len(up.seen), 2)):
        (prefill,) = [s for s in pair if s.host != "d"]
        (decode,) = [s for s in pair if s.host == "d"]
        assert decode.body["kv_transfer_params"]["remote_engine_id"] == f"engine-{prefill.host}"
    assert balancers(path) == {
        "prefill": {"http://p0:8000": 0, "http://p1:8000": 0},
        "decode": {"http://d:8000": 0},
    }


def push_over_two_decodes(up: Upstreams) -> PushPath:
    config = PushConfig(mode="push", prefill=ENGINES, decode=["http://d1:8000", "http://d2:8000"])
    return made(make_throughput_path(config, upstreams=up.pool()), PushPath)


async def test_a_split_request_whose_prefill_refused_is_not_sent_again() -> None:
    up = Upstreams()
    up.on("p0", failing(httpx.ConnectError("refused")))
    up.on("p1", answer(PREFILL_ANSWER))
    up.on("d1", answer(DECODE_ANSWER))
    up.on("d2", answer(DECODE_ANSWER))
    path = push_over_two_decodes(up)
    async with asgi_client(path) as client:
        response = await client.post("/v1/completions", json=CHAT)
    # The decode leg named p0's engine: another prefill engine cannot serve it.
    assert response.json()["error"]["code"] == "prefill_unreachable"
    assert [seen.host for seen in up.to("p1")] == []
    prefill_set = path.server_sets()[0]
    assert prefill_set.snapshot()["http://p0:8000"]["last_failure"] == "unreachable"


async def test_a_request_served_whole_goes_to_the_other_decode_if_one_refused() -> None:
    up = Upstreams()
    up.on("d1", failing(httpx.ConnectError("refused")))
    up.on("d2", answer(DECODE_ANSWER))
    body = {"model": "m", "prompt": "hi there", "echo": True, "logprobs": 1, "max_tokens": 0}
    async with asgi_client(push_over_two_decodes(up)) as client:
        response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert [seen.host for seen in up.seen] == ["d1", "d2"]


async def test_busy_prefill_engines_send_the_request_whole_to_the_decode() -> None:
    """Conditional disaggregation in push mode: the decode instance serves the client's
    body whole, and no engine is named to it."""
    up = Upstreams()
    up.on("p0", answer(PREFILL_ANSWER))
    up.on("d", answer(DECODE_ANSWER))
    conditional = ConditionalConfig(prefill_busier_by=1)
    config = PushConfig(mode="push", prefill=ENGINES[:1], decode=["http://d:8000"])
    path = made(
        make_throughput_path(
            config.model_copy(update={"conditional": conditional}), upstreams=up.pool()
        ),
        PushPath,
    )
    prefill_set, _ = path.server_sets()
    with prefill_set.hold("http://p0:8000"):
        async with asgi_client(path) as client:
            response = await client.post("/v1/completions", json={**CHAT, "prompt": "hi"})
    assert response.status_code == 200
    (decode,) = up.seen
    assert decode.host == "d" and "kv_transfer_params" not in decode.body
