"""The simulated vLLM answers as vLLM 0.32 does: n choices, chunk layout, refusals."""

import json
from typing import Any

import httpx
import pytest

from sim.stack import ServerInfo, SimStack
from tests.support.stacks import StackPool

pytestmark = pytest.mark.e2e

FAST = ["--itl-ms", "0", "--prefill-ms-per-token", "0"]
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=0, prefills=0, proxy=True, model=["sim-model", "alias"], proxy_args=FAST
    )


@pytest.fixture
def server(stack: SimStack) -> ServerInfo:
    assert stack.proxy is not None
    return stack.proxy


async def _chunks(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[Any]:
    response = await client.post(url, json=body)
    assert response.status_code == 200
    lines = [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


async def test_n_choices_whole_and_streamed(client: httpx.AsyncClient, server: ServerInfo) -> None:
    body = {"messages": HI, "n": 2, "max_tokens": 3, "ignore_eos": True}
    url = server.url + "/v1/chat/completions"
    whole = (await client.post(url, json=body)).json()
    assert [c["index"] for c in whole["choices"]] == [0, 1]
    assert whole["usage"]["completion_tokens"] == 6
    chunks = await _chunks(client, url, {**body, "stream": True})
    indices = [c["choices"][0]["index"] for c in chunks]
    assert indices == [0, 1] + [0, 1] * 3  # role chunks, then one chunk per token per choice


async def test_the_finish_rides_on_the_last_tokens_chunk(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    body = {"messages": HI, "max_tokens": 4, "ignore_eos": True, "stream": True}
    chunks = await _chunks(client, server.url + "/v1/chat/completions", body)
    role, *tokens = chunks
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert list(role)[-2:] == ["prompt_token_ids", "prompt_text"]
    assert len(tokens) == 4
    assert all("stop_reason" not in c["choices"][0] for c in tokens[:-1])
    last = tokens[-1]
    assert (last["choices"][0]["finish_reason"], last["choices"][0]["stop_reason"]) == (
        "length",
        None,
    )
    assert last["system_fingerprint"].startswith("vllm-0.32.0-")
    assert all("system_fingerprint" not in c for c in [role, *tokens[:-1]])


async def test_echo_with_logprobs_returns_the_prompts_logprobs(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    body = {"prompt": "hello world", "echo": True, "logprobs": 1, "max_tokens": 0}
    response = await client.post(server.url + "/v1/completions", json=body)
    assert response.status_code == 200
    choice = response.json()["choices"][0]
    assert choice["text"] == "hello world"
    assert choice["logprobs"]["token_logprobs"][0] is None
    assert choice["prompt_logprobs"][0] is None
    assert len(choice["prompt_logprobs"]) == len(choice["logprobs"]["tokens"])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": HI, "n": 0}, None),
        ({"messages": HI, "top_p": 0}, "top_p"),
        ({"messages": HI, "temperature": -1}, "temperature"),
        ({"messages": HI, "max_tokens": 200000}, "max_tokens"),
        ({"messages": [{"role": "user", "content": 5}]}, "body.messages.0.content"),
        (
            {"messages": HI, "tools": [{"type": "x", "function": {"name": "f"}}]},
            "body.tools.0.type",
        ),
    ],
)
async def test_refusals(
    client: httpx.AsyncClient, server: ServerInfo, body: dict[str, Any], param: str | None
) -> None:
    response = await client.post(server.url + "/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


async def test_a_body_that_is_not_json_media_is_refused(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    response = await client.post(
        server.url + "/v1/chat/completions",
        content=json.dumps({"messages": HI}),
        headers={"content-type": "text/plain"},
    )
    assert response.status_code == 400


async def test_out_of_vocabulary_prompt_ids_are_refused(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    body = {"prompt": [1, 2, 10**9]}
    response = await client.post(server.url + "/v1/completions", json=body)
    assert response.status_code == 400
    assert "out of vocabulary" in response.json()["error"]["message"]


async def test_unknown_paths_and_models_answer_json(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    response = await client.get(server.url + "/v1/nope")
    assert (response.status_code, response.json()) == (404, {"detail": "Not Found"})
    body = {"model": "nope", "messages": HI}
    response = await client.post(server.url + "/v1/chat/completions", json=body)
    assert response.status_code == 404
    assert response.json()["error"]["message"].endswith("Valid aliases: sim-model, alias.")


async def test_a_cut_responses_stream_completes_incomplete(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    body = {"input": "hi", "max_output_tokens": 2, "stream": True}
    response = await client.post(server.url + "/v1/responses", json=body)
    events = [line[7:] for line in response.text.split("\n") if line.startswith("event: ")]
    assert events[-1] == "response.completed"
    last = json.loads(response.text.strip().split("\n")[-1][len("data: ") :])
    assert last["response"]["status"] == "incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


@pytest.mark.parametrize("stream", [False, True])
async def test_null_sampling_numbers_of_a_responses_request_answer_as_unset(
    client: httpx.AsyncClient, server: ServerInfo, stream: bool
) -> None:
    body = {"input": "hi", "max_output_tokens": 2, "stream": stream}
    nulls = {"temperature": None, "top_p": None, "presence_penalty": None}
    response = await client.post(server.url + "/v1/responses", json={**body, **nulls})
    assert response.status_code == 200
    if stream:
        answer = json.loads(response.text.strip().split("\n")[-1][len("data: ") :])["response"]
    else:
        answer = response.json()
    unset = {"temperature": 1.0, "top_p": 1.0, "presence_penalty": 0.0}
    assert {key: answer[key] for key in unset} == unset


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
async def test_return_token_ids_and_a_greedy_continuation_of_part_of_the_answer(
    client: httpx.AsyncClient, server: ServerInfo, endpoint: str
) -> None:
    if endpoint == "chat":
        url, body = server.url + "/v1/chat/completions", {"messages": HI}
    else:
        url, body = server.url + "/v1/completions", {"prompt": "hi", "max_tokens": 500}
    whole = (await client.post(url, json={**body, "return_token_ids": True})).json()
    choice = whole["choices"][0]
    prompt_ids = whole["prompt_token_ids"] if endpoint == "chat" else choice["prompt_token_ids"]
    assert prompt_ids and choice["token_ids"]
    output = choice["token_ids"]
    # The prompt's ids and the first three of the answer: the rest of the same answer.
    context = [*prompt_ids, *output[:3]]
    if endpoint == "chat":
        rest_body = {**body, "kv_transfer_params": {"prompt_token_ids": context}}
    else:
        rest_body = {"prompt": context, "max_tokens": 500}
    rest = (await client.post(url, json={**rest_body, "return_token_ids": True})).json()
    assert rest["choices"][0]["token_ids"] == output[3:]
    plain = (await client.post(url, json=body)).json()["choices"][0]
    assert plain["token_ids"] is None
