"""vLLM's native disaggregation on the simulators: NIXL pull and push (docs/protocols.md §2)."""

import asyncio
import json
from typing import Any

import httpx
import pytest

from sim.stack import ServerInfo, SimStack
from tests.support.legs import nixl_prefill_body, push_decode_params
from tests.support.stacks import StackPool

from .sim_support import new_rid, wait_until

pytestmark = pytest.mark.e2e

FAST = ["--itl-ms", "0", "--prefill-ms-per-token", "0"]
TEXT = "naïve 日本語 🙂 <think>x</think> done"
BODY = {
    "model": "sim-model",
    "messages": [{"role": "user", "content": f"[[sim-output]]{TEXT}[[/sim-output]]"}],
    "max_tokens": 100,
}


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=0,
        prefills=2,
        decodes=1,
        prefill_args=FAST,
        decode_args=FAST,
        instance_args={"prefill-1": ["--kv-expiry-s", "0"]},
    )


async def _prefill(
    client: httpx.AsyncClient, prefill: ServerInfo, request_id: str
) -> httpx.Response:
    return await client.post(
        f"{prefill.url}/v1/chat/completions",
        json=nixl_prefill_body(BODY),
        headers={"X-Request-Id": request_id},
    )


async def _decode(
    client: httpx.AsyncClient, decode: ServerInfo, request_id: str, params: dict[str, Any]
) -> httpx.Response:
    body = {**BODY, "kv_transfer_params": params}
    return await client.post(
        f"{decode.url}/v1/chat/completions", json=body, headers={"X-Request-Id": request_id}
    )


async def test_pull(client: httpx.AsyncClient, stack: SimStack) -> None:
    prefill, decode = stack.prefills[0], stack.decodes[0]
    request_id = new_rid()
    first = (await _prefill(client, prefill, request_id)).json()
    params = first["kv_transfer_params"]
    prompt = first["usage"]["prompt_tokens"]
    # vLLM 0.32's NixlConnector's keys in its order (tests/real_vllm/test_native_nixl.py),
    # a list of block ids per KV cache group.
    assert list(params.items()) == [
        ("do_remote_prefill", True),
        ("do_remote_decode", False),
        ("remote_block_ids", [list(range(1, -(-prompt // 16) + 1))]),
        ("remote_engine_id", "prefill-0"),
        ("remote_request_id", request_id),
        ("remote_host", prefill.side_channel_host),
        ("remote_port", prefill.side_channel_port),
        ("tp_size", 1),
        ("dcp_size", 1),
        ("pp_size", 1),
        ("remote_num_tokens", prompt),
        ("remote_blocks_expiry_time", None),
        ("transfer_mode", "pull"),
        ("remote_prefill_cached_tokens", 0),
    ]
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    second = (await _decode(client, decode, request_id, params)).json()
    assert second["id"] == f"chatcmpl-{request_id}"
    assert second["choices"][0]["message"]["content"] == TEXT
    prompt_tokens = second["usage"]["prompt_tokens"]
    assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": prompt_tokens}
    assert prompt_tokens == first["usage"]["prompt_tokens"]
    records = (await client.get(f"{decode.url}/sim/requests")).json()
    assert records["requests"][0]["kv_mode"] == "nixl_consumer_pull"
    reads = (await client.get(f"{prefill.url}/sim/requests")).json()["side_channel"]
    assert [(r["remote_request_id"], r["outcome"]) for r in reads] == [(request_id, "read")]
    again = await _decode(client, decode, request_id, params)
    assert again.status_code == 500  # the state was read once and freed


async def test_pull_with_a_streaming_decode_leg(client: httpx.AsyncClient, stack: SimStack) -> None:
    prefill, decode = stack.prefills[0], stack.decodes[0]
    request_id = new_rid()
    params = (await _prefill(client, prefill, request_id)).json()["kv_transfer_params"]
    body = {**BODY, "stream": True, "kv_transfer_params": params}
    text = ""
    async with client.stream(
        "POST", f"{decode.url}/v1/chat/completions", json=body, headers={"X-Request-Id": request_id}
    ) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    text += choice["delta"].get("content") or ""
    assert text == TEXT


@pytest.mark.parametrize("order", ["decode-first", "concurrent", "prefill-first"])
async def test_push(client: httpx.AsyncClient, stack: SimStack, order: str) -> None:
    prefill, decode = stack.prefills[0], stack.decodes[0]
    request_id = new_rid()
    params = push_decode_params(prefill, request_id)
    if order == "prefill-first":
        await _prefill(client, prefill, request_id)
        answer = await _decode(client, decode, request_id, params)
    elif order == "concurrent":
        answer, _ = await asyncio.gather(
            _decode(client, decode, request_id, params), _prefill(client, prefill, request_id)
        )
    else:
        pending = asyncio.ensure_future(_decode(client, decode, request_id, params))

        async def registered() -> bool:
            reads = (await client.get(f"{decode.url}/sim/requests")).json()["requests"]
            return len(reads) == 1

        await wait_until(registered)
        assert not pending.done()
        await _prefill(client, prefill, request_id)
        answer = await pending
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == TEXT
    records = (await client.get(f"{decode.url}/sim/requests")).json()
    assert records["requests"][0]["kv_mode"] == "nixl_consumer_push"


async def test_expired_state_cannot_be_pulled(client: httpx.AsyncClient, stack: SimStack) -> None:
    prefill, decode = stack.prefills[1], stack.decodes[0]
    request_id = new_rid()
    params = (await _prefill(client, prefill, request_id)).json()["kv_transfer_params"]
    answer = await _decode(client, decode, request_id, params)
    assert answer.status_code == 500
    assert "KV transfer" in answer.json()["error"]["message"]


@pytest.mark.parametrize("where", ["prefill", "decode"])
async def test_fault_pull_failure(client: httpx.AsyncClient, stack: SimStack, where: str) -> None:
    prefill, decode = stack.prefills[0], stack.decodes[0]
    target = prefill if where == "prefill" else decode
    await client.post(f"{target.url}/sim/faults", json={"pull_fail": True, "count": 1})
    request_id = new_rid()
    params = (await _prefill(client, prefill, request_id)).json()["kv_transfer_params"]
    failed = await _decode(client, decode, request_id, params)
    assert failed.status_code == 500
    assert failed.json()["error"]["type"] == "InternalServerError"


async def test_a_decode_instance_ignores_tilert_params(
    client: httpx.AsyncClient, stack: SimStack
) -> None:
    decode = stack.decodes[0]
    body = {**BODY, "kv_transfer_params": {"tilert_host": "127.0.0.1", "tilert_ctrl_port": 1}}
    answer = await client.post(f"{decode.url}/v1/chat/completions", json=body)
    assert answer.json()["choices"][0]["message"]["content"] == TEXT
    records = (await client.get(f"{decode.url}/sim/requests")).json()
    assert records["transfers"] == []
    assert records["requests"][0]["kv_mode"] is None
