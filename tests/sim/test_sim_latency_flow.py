"""The latency path driven as TileRT's router does: vLLM prefill → TileRT node decode.

Prefill with max_tokens 1, logprobs and kv_transfer_params under a dash-free
X-Request-Id, read ``token_id:N``, then stream /pd/decode for the reduced rid.
"""

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from sim.stack import SimStack
from sim.tokenizers import load_vocab

from .sim_support import (
    latency_request,
    new_rid,
    reset_stack,
    settled_transfers,
    wait_until,
)

pytestmark = pytest.mark.e2e

FAST = ["--itl-ms", "0", "--prefill-ms-per-token", "0"]
NODE = ["--step-ms", "1"]
TEXTS = {
    "deepseek": "Sure — café 🙂 日本語.</think>Checking now.\n\n<｜DSML｜function_calls>\n"
    '<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="location" string="true">'
    "杭州</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
    "glm": "Need two lookups — naïve 日本語 🙂</think><tool_call>get_weather<arg_key>city"
    "</arg_key><arg_value>Beijing</arg_value></tool_call>",
}


def _stack(tokenizer: str, **kwargs: Any) -> SimStack:
    return SimStack(
        tokenizer=tokenizer, prefill_args=FAST, proxy_args=FAST, node_args=NODE, **kwargs
    )


@pytest.fixture(scope="module", params=["deepseek", "glm"])
def family(request: pytest.FixtureRequest) -> Iterator[tuple[str, SimStack]]:
    with _stack(request.param, nodes=1, prefills=1, proxy=True) as running:
        yield request.param, running


@pytest.fixture(scope="module")
def stack() -> Iterator[SimStack]:
    instance = {
        "prefill-0": ["--transfer-order", "response-first"],
        "prefill-1": ["--transfer-order", "transfer-first"],
    }
    with _stack("deepseek", nodes=2, prefills=2, instance_args=instance) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as http:
        yield http


def _payload(endpoint: str, content: str) -> dict[str, Any]:
    if endpoint == "chat":
        return {"model": "sim-model", "messages": [{"role": "user", "content": content}]}
    return {"model": "sim-model", "prompt": content}


async def _plain_ids(client: httpx.AsyncClient, url: str, endpoint: str, payload: dict) -> list:
    """Token ids of plain serving, read from token_id logprobs (EOS included)."""
    if endpoint == "chat":
        body = {**payload, "logprobs": True, "max_tokens": 4096}
        response = await client.post(f"{url}/v1/chat/completions", json=body)
        tokens = [e["token"] for e in response.json()["choices"][0]["logprobs"]["content"]]
    else:
        body = {**payload, "logprobs": 0, "max_tokens": 4096}
        response = await client.post(f"{url}/v1/completions", json=body)
        tokens = response.json()["choices"][0]["logprobs"]["tokens"]
    return [int(t.split(":")[1]) for t in tokens]


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("scripted", [True, False])
async def test_prefill_then_decode_equals_plain_serving(
    client: httpx.AsyncClient, family: tuple[str, SimStack], endpoint: str, scripted: bool
) -> None:
    tokenizer, family_stack = family
    await reset_stack(client, family_stack)
    vocab = load_vocab(tokenizer)
    text = TEXTS[tokenizer]
    content = f"Please [[sim-output]]{text}[[/sim-output]]" if scripted else "Tell me a story"
    payload = _payload(endpoint, content)
    node, prefill = family_stack.nodes[0], family_stack.prefills[0]
    result = await latency_request(client, prefill.url, node, endpoint, payload)
    assert result.decode.ids[0] == result.first
    assert result.decode.final["finish_reason"] == "stop"
    assert family_stack.proxy is not None
    plain = await _plain_ids(client, family_stack.proxy.url, endpoint, payload)
    assert plain[-1] in vocab.eos_ids
    assert result.decode.ids == plain[:-1]
    if scripted:
        assert vocab.decode(result.decode.ids) == text
    assert result.prefill["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize(("prefill_index", "order"), [(0, "response-first"), (1, "transfer-first")])
async def test_transfer_finishes_before_or_after_the_prefill_response(
    client: httpx.AsyncClient, stack: SimStack, prefill_index: int, order: str
) -> None:
    await reset_stack(client, stack)
    prefill, node = stack.prefills[prefill_index], stack.nodes[0]
    result = await latency_request(client, prefill.url, node, "chat", _payload("chat", "Hi"))
    assert result.decode.final["finish_reason"] == "stop"
    (sent,) = await settled_transfers(client, prefill.url, 1)
    (request,) = (await client.get(f"{prefill.url}/sim/requests")).json()["requests"]
    assert (sent["rid"], sent["outcome"]) == (result.rid, "complete")
    if order == "response-first":
        assert sent["start"] >= request["finished"]
    else:
        assert sent["end"] <= request["finished"]


async def test_max_tokens_one_still_consumes_the_transfer(
    client: httpx.AsyncClient, stack: SimStack
) -> None:
    await reset_stack(client, stack)
    node = stack.nodes[1]
    result = await latency_request(
        client,
        stack.prefills[0].url,
        node,
        "completions",
        _payload("completions", "Hi"),
        max_tokens=1,
    )
    assert result.decode.ids == [result.first]
    assert result.decode.final["finish_reason"] == "length"
    status = (await client.get(f"{node.url}/decode_status")).json()
    assert status == {"status": "idle", "current_rid": None}


async def test_slow_transfer_makes_the_decode_wait(
    client: httpx.AsyncClient, stack: SimStack
) -> None:
    await reset_stack(client, stack)
    prefill, node = stack.prefills[0], stack.nodes[0]
    await client.post(f"{prefill.url}/sim/faults", json={"slow_transfer_ms": 300, "count": 1})
    result = await latency_request(client, prefill.url, node, "chat", _payload("chat", "Hi"))
    assert result.decode.final["finish_reason"] == "stop"
    records = (await client.get(f"{node.url}/sim/records")).json()
    complete = next(c for c in records["control"] if c["outcome"] == "complete")
    assert records["decodes"][0]["start"] < complete["time"]


async def test_failed_transfer_blocks_the_slot_and_times_out_the_decode(
    client: httpx.AsyncClient, stack: SimStack
) -> None:
    await reset_stack(client, stack)
    prefill, node = stack.prefills[1], stack.nodes[0]
    await client.post(f"{prefill.url}/sim/faults", json={"transfer_no_done": True, "count": 1})
    kv = {"tilert_host": node.host, "tilert_ctrl_port": node.ctrl_port}
    body = {**_payload("chat", "Hi"), "max_tokens": 1, "logprobs": True, "kv_transfer_params": kv}
    failed, other = new_rid(), new_rid()
    await client.post(
        f"{prefill.url}/v1/chat/completions", json=body, headers={"X-Request-Id": failed}
    )
    await client.post(
        f"{prefill.url}/v1/chat/completions", json=body, headers={"X-Request-Id": other}
    )
    transfers = (await client.get(f"{prefill.url}/sim/requests")).json()["transfers"]
    assert [(t["rid"], t["outcome"]) for t in transfers] == [
        (failed, "no_done"),
        (other, "refused_busy"),
    ]
    decode = await client.post(
        f"{node.url}/pd/decode", json={"rid": failed, "first_token_id": 5, "timeout_s": 0.05}
    )
    assert decode.status_code == 504


async def test_dashed_client_id_leaves_the_decode_waiting(
    client: httpx.AsyncClient, stack: SimStack
) -> None:
    await reset_stack(client, stack)
    prefill, node = stack.prefills[1], stack.nodes[1]
    kv = {"tilert_host": node.host, "tilert_ctrl_port": node.ctrl_port}
    body = {**_payload("chat", "Hi"), "max_tokens": 1, "logprobs": True, "kv_transfer_params": kv}
    response = await client.post(
        f"{prefill.url}/v1/chat/completions", json=body, headers={"X-Request-Id": "req-12ab"}
    )
    assert response.json()["id"] == "chatcmpl-req-12ab"
    decode = await client.post(
        f"{node.url}/pd/decode", json={"rid": "req", "first_token_id": 5, "timeout_s": 0.05}
    )
    assert decode.json() == {"error": "kv_transfer_timeout", "rid": "req"}
    control = (await client.get(f"{node.url}/sim/records")).json()["control"]
    assert {c["rid"] for c in control} == {"req-12ab"}


async def test_requests_without_tilert_host_are_not_claimed(
    client: httpx.AsyncClient, stack: SimStack
) -> None:
    await reset_stack(client, stack)
    prefill = stack.prefills[0]
    body = {**_payload("chat", "Hi"), "kv_transfer_params": {"something": "else"}}
    response = await client.post(f"{prefill.url}/v1/chat/completions", json=body)
    assert response.status_code == 200

    async def recorded() -> bool:
        return len((await client.get(f"{prefill.url}/sim/requests")).json()["requests"]) == 1

    await wait_until(recorded)
    records = (await client.get(f"{prefill.url}/sim/requests")).json()
    assert records["transfers"] == []
    assert records["requests"][0]["kv_mode"] is None
