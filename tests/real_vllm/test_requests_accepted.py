"""What the gateway accepts and refuses, next to real vLLM: each request is sent to vLLM
directly and through a gateway in front of it, and both accept it (200) or both refuse it
with the same status and OpenAI's error shape. The gateway validates before routing, so a
refusal here is the gateway's own, never vLLM's relayed.

The gateway's model has a TileRT pool (a node nobody listens on) besides the native path:
rules send everything native, but a client may ask for the latency path, which requests
that score their prompt must not get.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.support.classify_fixtures import closed_node
from tests.support.gateway import GatewayProcess, start_gateway

pytestmark = [pytest.mark.real_vllm, pytest.mark.e2e]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HI = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": HI, "max_tokens": 2, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"prompt": "hello world", "max_tokens": 2, **fields}


# name: (path, body without its model, status both must answer)
CASES: dict[str, tuple[str, dict[str, Any], int]] = {
    "max_tokens as an integral float": (CHAT, chat(max_tokens=5.0), 200),
    "max_tokens as text": (CHAT, chat(max_tokens="5"), 200),
    "temperature as text": (CHAT, chat(temperature="0"), 200),
    "stream as text": (CHAT, chat(stream="false"), 200),
    "completions stream as text": (COMPLETIONS, completion(stream="false", n="1"), 200),
    "a custom role": (CHAT, chat(messages=[{"role": "critic", "content": "hi"}]), 200),
    "chat prompt_logprobs": (CHAT, chat(prompt_logprobs=1), 200),
    "prompt scored": (COMPLETIONS, completion(echo=True, logprobs=1, max_tokens=0), 200),
    "max_tokens with a fraction": (CHAT, chat(max_tokens=5.5), 400),
    "max_tokens not a number": (CHAT, chat(max_tokens="abc"), 400),
    "messages not a list": (CHAT, {"messages": 5}, 400),
    "no messages": (CHAT, {"max_tokens": 2}, 400),
    "a role that is no text": (CHAT, chat(messages=[{"role": 5, "content": "hi"}]), 400),
    "n zero": (CHAT, chat(n=0), 400),
    "temperature negative": (CHAT, chat(temperature=-1), 400),
    "max_tokens zero without echo": (COMPLETIONS, completion(max_tokens=0), 400),
    "chat max_tokens zero": (CHAT, chat(max_tokens=0), 400),
    "stream neither true nor false": (CHAT, chat(stream="maybe"), 400),
}


@pytest.fixture(scope="module")
def gateway(real_vllm: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    model = {
        "name": real_vllm.model,
        "tokenizer": str(real_vllm.model_dir),
        "latency": {"prefill": [real_vllm.url], "nodes": [closed_node()], "max_seq_len": 2048},
        "throughput": {"mode": "proxy", "urls": [real_vllm.url]},
    }
    rules = {"default": {"name": "native", "path": "throughput", "allow_client_route": ["latency"]}}
    with start_gateway(tmp_path_factory, [model], classification={"rules": rules}) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=120) as client:
        yield client


def post(
    client: httpx.Client,
    base: str,
    path: str,
    content: bytes,
    *,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    return client.post(
        base + path, content=content, headers={"content-type": content_type, **(headers or {})}
    )


def assert_error_shape(response: httpx.Response) -> dict[str, Any]:
    """OpenAI's error object, as vLLM and the gateway both send it."""
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str)
    return error


def assert_same_verdict(direct: httpx.Response, gateway: httpx.Response, status: int) -> None:
    assert direct.status_code == status, direct.text
    assert gateway.status_code == status, gateway.text
    if status == 200:
        assert gateway.json()["object"] == direct.json()["object"]
    else:
        assert_error_shape(direct)
        assert_error_shape(gateway)


@pytest.mark.parametrize("case", CASES)
def test_both_accept_or_both_refuse(
    case: str, real_vllm: Any, gateway: GatewayProcess, client: httpx.Client
) -> None:
    path, body, status = CASES[case]
    content = orjson.dumps({"model": real_vllm.model, **body})
    direct = post(client, real_vllm.url, path, content)
    through = post(client, gateway.url, path, content)
    assert_same_verdict(direct, through, status)


@pytest.mark.parametrize(
    ("case", "content", "content_type"),
    [
        ("bad JSON", b'{"model":', "application/json"),
        ("not an object", b"[1, 2]", "application/json"),
        ("text/plain", orjson.dumps({"model": "tiny", "messages": HI}), "text/plain"),
    ],
)
def test_bodies_that_are_not_json_objects_are_refused_by_both(
    case: str,
    content: bytes,
    content_type: str,
    real_vllm: Any,
    gateway: GatewayProcess,
    client: httpx.Client,
) -> None:
    direct = post(client, real_vllm.url, CHAT, content, content_type=content_type)
    through = post(client, gateway.url, CHAT, content, content_type=content_type)
    assert_same_verdict(direct, through, 400)


def test_an_unknown_model_is_a_404_from_both(
    real_vllm: Any, gateway: GatewayProcess, client: httpx.Client
) -> None:
    content = orjson.dumps({"model": "no-such-model", **chat()})
    direct = post(client, real_vllm.url, CHAT, content)
    through = post(client, gateway.url, CHAT, content)
    assert direct.status_code == through.status_code == 404
    assert assert_error_shape(direct)["param"] == assert_error_shape(through)["param"] == "model"


@pytest.mark.parametrize(
    ("path", "body", "reason"),
    [
        (COMPLETIONS, completion(echo=True, logprobs=1, max_tokens=0), "echo"),
        (COMPLETIONS, completion(echo="true", logprobs=1, max_tokens="0"), "echo"),
        (CHAT, chat(prompt_logprobs=1), "prompt_logprobs"),
    ],
)
def test_a_scored_prompt_is_served_natively_and_says_why(
    path: str,
    body: dict[str, Any],
    reason: str,
    real_vllm: Any,
    gateway: GatewayProcess,
    client: httpx.Client,
) -> None:
    """Asked for the latency path, which cannot score a prompt, the gateway serves it
    natively, names the reason, and relays vLLM's prompt logprobs as vLLM sent them."""
    content = orjson.dumps({"model": real_vllm.model, **body})
    direct = post(client, real_vllm.url, path, content)
    through = post(client, gateway.url, path, content, headers={"x-pd-route": "latency"})
    assert direct.status_code == through.status_code == 200, through.text
    assert through.headers["x-pd-route"] == "throughput"
    assert through.headers["x-pd-reroute-reason"] == reason
    ours, theirs = through.json(), direct.json()
    if path == COMPLETIONS:
        [mine], [other] = ours["choices"], theirs["choices"]
        assert mine["text"] == other["text"] == "hello world"
        assert_logprobs_close(mine["logprobs"], other["logprobs"])
        assert_logprobs_close(mine["prompt_logprobs"], other["prompt_logprobs"])
    else:
        assert_logprobs_close(ours["prompt_logprobs"], theirs["prompt_logprobs"])
    assert ours["usage"] == theirs["usage"]


def assert_logprobs_close(ours: Any, theirs: Any) -> None:
    """Equal but for the last digits of floats (vLLM's CPU kernels batch requests)."""
    if isinstance(theirs, float):
        assert ours == pytest.approx(theirs, abs=1e-3)
    elif isinstance(theirs, dict):
        assert set(ours) == set(theirs)
        for key in theirs:
            assert_logprobs_close(ours[key], theirs[key])
    elif isinstance(theirs, list):
        assert len(ours) == len(theirs)
        for mine, other in zip(ours, theirs, strict=True):
            assert_logprobs_close(mine, other)
    else:
        assert ours == theirs


def test_the_model_list_is_vllms_under_the_gateways_names(
    real_vllm: Any, gateway: GatewayProcess, client: httpx.Client
) -> None:
    direct = client.get(real_vllm.url + "/v1/models").json()["data"][0]
    listed = client.get(gateway.url + "/v1/models").json()
    assert listed["object"] == "list"
    [ours] = listed["data"]
    one = client.get(f"{gateway.url}/v1/models/{real_vllm.model}").json()
    for card in (ours, one):
        assert set(card) == set(direct)
        # Each answer of vLLM's makes its times and permission ids anew.
        for key in set(direct) - {"created", "permission"}:
            assert card[key] == direct[key], key
        assert [set(p) for p in card["permission"]] == [set(p) for p in direct["permission"]]
