"""The simulated vLLM OpenAI server: formats, ids, logprobs, errors and faults."""

import asyncio
import json
import re
from typing import Any

import httpx
import pytest

from sim.ids import reduce_rid
from sim.script import render_chat
from sim.stack import ServerInfo, SimStack
from sim.tokenizers import load_vocab
from tests.support.stacks import StackPool

from .sim_support import new_rid, wait_until

pytestmark = pytest.mark.e2e

VOCAB = load_vocab("deepseek")
TEXT = "Hi café 日本語 🙂 <think>x</think>"
SCRIPTED = f"[[sim-output]]{TEXT}[[/sim-output]]"
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": SCRIPTED}]}
COMPLETION = {"model": "alias", "prompt": SCRIPTED}
FAST = ["--itl-ms", "0", "--prefill-ms-per-token", "0"]


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=0, prefills=0, proxy=True, model=["sim-model", "alias"], proxy_args=FAST
    )


@pytest.fixture
def server(stack: SimStack) -> ServerInfo:
    assert stack.proxy is not None
    return stack.proxy


def _path(endpoint: str) -> str:
    return "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"


async def _sse(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[Any]:
    events: list[Any] = []
    async with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def _requests(client: httpx.AsyncClient, server: ServerInfo) -> list[dict[str, Any]]:
    return (await client.get(f"{server.url}/sim/requests")).json()["requests"]


async def test_models_and_health(client: httpx.AsyncClient, server: ServerInfo) -> None:
    models = (await client.get(f"{server.url}/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["sim-model", "alias"]
    assert (await client.get(f"{server.url}/health")).status_code == 200


async def test_chat_non_stream(client: httpx.AsyncClient, server: ServerInfo) -> None:
    response = await client.post(f"{server.url}/v1/chat/completions", json=CHAT)
    body = response.json()
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", body["id"])
    assert body["object"] == "chat.completion"
    assert body["model"] == "sim-model"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == TEXT
    assert choice["finish_reason"] == "stop"
    assert choice["logprobs"] is None
    prompt_tokens = len(VOCAB.encode(render_chat(CHAT["messages"])))
    completion_tokens = len(VOCAB.encode(TEXT)) + 1  # vLLM counts the EOS token
    assert body["usage"] == {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": None,
    }
    assert body["kv_transfer_params"] is None


async def test_completion_non_stream(client: httpx.AsyncClient, server: ServerInfo) -> None:
    body = (await client.post(f"{server.url}/v1/completions", json=COMPLETION)).json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == TEXT
    assert body["usage"]["prompt_tokens"] == len(VOCAB.encode(SCRIPTED))


@pytest.mark.parametrize(
    ("endpoint", "prefix", "engine_pattern"),
    [
        ("chat", "chatcmpl-", r"chatcmpl-{}-[0-9a-f]{{8}}"),
        ("completions", "cmpl-", r"cmpl-{}-0-[0-9a-f]{{8}}"),
    ],
)
async def test_ids_follow_x_request_id(
    client: httpx.AsyncClient,
    server: ServerInfo,
    endpoint: str,
    prefix: str,
    engine_pattern: str,
) -> None:
    base = new_rid()
    body = CHAT if endpoint == "chat" else COMPLETION
    response = await client.post(
        server.url + _path(endpoint), json=body, headers={"X-Request-Id": base}
    )
    assert response.json()["id"] == prefix + base
    (record,) = await _requests(client, server)
    assert record["headers"]["x-request-id"] == base
    assert record["body"] == body
    assert re.fullmatch(engine_pattern.format(base), record["engine_request_id"])
    assert record["rid"] == base == reduce_rid(response.json()["id"])


async def test_a_dashed_request_id_reduces_differently_on_each_side(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    response = await client.post(
        f"{server.url}/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "req-12ab"}
    )
    (record,) = await _requests(client, server)
    assert record["rid"] == "req-12ab"
    assert reduce_rid(response.json()["id"]) == "req"


async def test_chat_stream(client: httpx.AsyncClient, server: ServerInfo) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    events = await _sse(client, f"{server.url}/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    chunks = [e for e in events[1:-1] if e["choices"]]
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == TEXT
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    usage = events[-2]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == len(VOCAB.encode(TEXT)) + 1
    assert len({e["id"] for e in events[:-1]}) == 1


async def test_completion_stream_without_usage(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    events = await _sse(client, f"{server.url}/v1/completions", {**COMPLETION, "stream": True})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["choices"] and c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == TEXT
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_chat_logprobs_are_token_ids(client: httpx.AsyncClient, server: ServerInfo) -> None:
    body = {**CHAT, "max_tokens": 1, "logprobs": True, "top_logprobs": 3}
    choice = (await client.post(f"{server.url}/v1/chat/completions", json=body)).json()["choices"][
        0
    ]
    first = VOCAB.encode(TEXT)[0]
    (entry,) = choice["logprobs"]["content"]
    assert entry["token"] == f"token_id:{first}"
    assert entry["top_logprobs"][0]["token"] == f"token_id:{first}"
    assert len(entry["top_logprobs"]) == 3
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] == VOCAB.decode([first])


async def test_completion_logprobs_are_token_ids(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    body = {**COMPLETION, "max_tokens": 2, "logprobs": 1}
    logprobs = (await client.post(f"{server.url}/v1/completions", json=body)).json()["choices"][0][
        "logprobs"
    ]
    assert logprobs["tokens"] == [f"token_id:{i}" for i in VOCAB.encode(TEXT)[:2]]
    assert len(logprobs["top_logprobs"]) == 2


async def test_fault_text_logprobs(client: httpx.AsyncClient, server: ServerInfo) -> None:
    await client.post(f"{server.url}/sim/faults", json={"text_logprobs": True, "count": 1})
    body = {**CHAT, "max_tokens": 1, "logprobs": True, "top_logprobs": 1}
    first = (await client.post(f"{server.url}/v1/chat/completions", json=body)).json()
    assert first["choices"][0]["logprobs"]["content"][0]["token"] == "Hi"
    second = (await client.post(f"{server.url}/v1/chat/completions", json=body)).json()
    assert second["choices"][0]["logprobs"]["content"][0]["token"].startswith("token_id:")


async def test_stop_strings(client: httpx.AsyncClient, server: ServerInfo) -> None:
    body = {**CHAT, "stop": ["日本"]}
    choice = (await client.post(f"{server.url}/v1/chat/completions", json=body)).json()["choices"][
        0
    ]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("Hi café ", "stop")
    assert choice["stop_reason"] == "日本"


async def test_filler_output_without_a_directive(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "Hello"}]}
    first = (await client.post(f"{server.url}/v1/chat/completions", json=body)).json()
    again = (await client.post(f"{server.url}/v1/chat/completions", json=body)).json()
    assert first["choices"][0]["message"]["content"] == again["choices"][0]["message"]["content"]
    assert first["usage"]["completion_tokens"] == 49


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/chat/completions", {"model": "nope", "messages": CHAT["messages"]}, 404, "model"),
        ("/v1/chat/completions", {"model": "sim-model"}, 400, "body.messages"),
        (
            "/v1/completions",
            {"model": "sim-model", "prompt": "x", "max_tokens": 0},
            400,
            "max_tokens",
        ),
        ("/v1/chat/completions", "not json", 400, "body.0"),
    ],
)
async def test_openai_errors(
    client: httpx.AsyncClient,
    server: ServerInfo,
    path: str,
    body: Any,
    status: int,
    param: str | None,
) -> None:
    if isinstance(body, str):
        response = await client.post(server.url + path, content=body)
    else:
        response = await client.post(server.url + path, json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"]) == (status, param)
    # vLLM types a body failing its schema by the bare status phrase.
    schema = param is not None and param.startswith("body")
    assert (
        error["type"] == "Bad Request"
        if schema
        else {400: "BadRequestError", 404: "NotFoundError"}[status]
    )


async def test_fault_http_status_for_the_next_request(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    await client.post(f"{server.url}/sim/faults", json={"http_status": 503, "count": 1})
    failed = await client.post(f"{server.url}/v1/chat/completions", json=CHAT)
    assert failed.status_code == 503
    assert failed.json()["error"]["type"] == "ServiceUnavailableError"
    assert (await client.post(f"{server.url}/v1/chat/completions", json=CHAT)).status_code == 200


async def test_fault_stall_never_answers(client: httpx.AsyncClient, server: ServerInfo) -> None:
    await client.post(f"{server.url}/sim/faults", json={"stall": True, "count": 1})
    pending = asyncio.ensure_future(client.post(f"{server.url}/v1/chat/completions", json=CHAT))

    async def received() -> bool:
        return len(await _requests(client, server)) == 1

    await wait_until(received)
    ok = await client.post(f"{server.url}/v1/chat/completions", json=CHAT)
    assert ok.status_code == 200  # a later request is answered; the stalled one is not
    assert not pending.done()
    assert (await _requests(client, server))[0]["status"] is None
    pending.cancel()


async def test_fault_die_mid_stream(client: httpx.AsyncClient, server: ServerInfo) -> None:
    await client.post(f"{server.url}/sim/faults", json={"die_after": 2, "count": 1})
    events = []
    with pytest.raises(httpx.RemoteProtocolError):
        async with client.stream(
            "POST", f"{server.url}/v1/chat/completions", json={**CHAT, "stream": True}
        ) as response:
            async for line in response.aiter_lines():
                if line:
                    events.append(line)
    assert len(events) == 2
    assert "[DONE]" not in events[-1]
