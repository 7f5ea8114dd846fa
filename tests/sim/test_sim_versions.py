"""TileRT 0.1.5 and 0.1.6 side by side over real sockets: each version's hazards
(docs/protocols.md §1.5, §1.6), its connector, and version mismatches."""

import asyncio
from typing import Any

import httpx
import pytest

from sim.framing import close_quietly, read_frame, write_frame
from sim.stack import NodeInfo, SimStack
from sim.tokenizers import load_vocab
from tests.support.stacks import StackPool

from .sim_support import (
    decode_stream,
    latency_request,
    new_rid,
    settled_transfers,
    transfer,
    transfer_open,
    wait_until,
)

pytestmark = pytest.mark.e2e

EOS = load_vocab("deepseek").eos_ids[0]
FAST = ["--itl-ms", "0", "--prefill-ms-per-token", "0"]
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "Hi"}]}
DEEP: dict[str, Any] = {"type": "object"}
for _ in range(70):
    DEEP = {"type": "object", "properties": {"x": DEEP}}
NODE_16 = ["--stream-interval-ms", "30", "--refusal-drain-s", "2", "--capabilities"]
CAPS = '{"logprobs": true, "grammar": true, "penalties": false}'


NODE_16.append(CAPS)


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=3,
        prefills=2,
        node_args=["--step-ms", "1"],
        prefill_args=FAST,
        instance_args={
            "node-0": ["--protocol", "0.1.5"],
            "node-1": NODE_16,
            "node-2": ["--senders", "8"],
            "prefill-0": ["--tilert-protocol", "0.1.5", "--transfer-ms-base", "50"],
            "prefill-1": ["--tilert-backoff-scale", "0.25", "--transfer-ms-base", "50"],
        },
    )


@pytest.fixture
def v15(stack: SimStack) -> NodeInfo:
    return stack.nodes[0]


@pytest.fixture
def v16(stack: SimStack) -> NodeInfo:
    return stack.nodes[1]


async def _records(client: httpx.AsyncClient, node: NodeInfo) -> dict[str, Any]:
    return (await client.get(f"{node.url}/sim/records")).json()


async def _decode(
    client: httpx.AsyncClient, node: NodeInfo, rid: str, **body: Any
) -> httpx.Response:
    payload = {"rid": rid, "first_token_id": 5, **body}
    return await client.post(f"{node.url}/pd/decode", json=payload)


async def _waiting(client: httpx.AsyncClient, node: NodeInfo, rid: str) -> None:
    async def check() -> bool:
        return (await client.get(f"{node.url}/decode_status")).json()["current_rid"] == rid

    await wait_until(check)


# -- 0.1.5 ---------------------------------------------------------------------------


async def test_v15_cancel_during_the_kv_wait_is_404_and_the_decode_ends_504(
    client: httpx.AsyncClient, v15: NodeInfo
) -> None:
    rid = new_rid()
    pending = asyncio.ensure_future(_decode(client, v15, rid, timeout_s=0.5))
    await _waiting(client, v15, rid)
    cancel = await client.post(f"{v15.url}/pd/cancel", json={"rid": rid})
    assert cancel.status_code == 404
    assert (await pending).status_code == 504


async def test_v15_a_504_erases_another_rids_transfer_in_progress(
    client: httpx.AsyncClient, v15: NodeInfo
) -> None:
    victim, failed = new_rid(), new_rid()
    opened = await transfer_open(v15, victim, plan=[5, 6, EOS])
    assert (await _decode(client, v15, failed, timeout_s=0.05)).status_code == 504
    assert await opened.done() is None  # accepted on the wire, but the slot is gone
    outcomes = [(c["rid"], c["outcome"]) for c in (await _records(client, v15))["control"]]
    assert (victim, "done") in outcomes and (victim, "complete") not in outcomes
    assert (await _decode(client, v15, victim, timeout_s=0.1)).status_code == 504
    # After a failed transfer the node is free for a new rid at once.
    fresh = new_rid()
    await transfer(v15, fresh, plan=[5, EOS])
    assert (await decode_stream(client, v15, fresh, 5)).ids == [5]


async def test_v15_a_stale_drop_erases_the_waiting_rids_own_transfer(
    client: httpx.AsyncClient, v15: NodeInfo
) -> None:
    orphan, rid = new_rid(), new_rid()
    await transfer(v15, orphan, plan=[9, EOS])
    opened = await transfer_open(v15, rid, plan=[5, 6, EOS])
    result = await _decode(client, v15, rid, timeout_s=0.3)
    await opened.done()
    assert result.status_code == 504
    records = await _records(client, v15)
    assert records["stale_dropped"] == [orphan]
    assert records["corruptions"][0] | {"at": 0} == {
        "rid": rid,
        "busy_rid": orphan,
        "kind": "overwrote_complete",
        "at": 0,
    }


async def test_v15_connector_writes_despite_a_busy_refusal(
    client: httpx.AsyncClient, stack: SimStack, v15: NodeInfo
) -> None:
    prefill = stack.prefills[0]
    holder = new_rid()
    opened = await transfer_open(v15, holder, plan=[5, 6, EOS])
    await client.post(
        f"{prefill.url}/v1/chat/completions",
        json={
            **CHAT,
            "max_tokens": 1,
            "kv_transfer_params": {"tilert_host": v15.host, "tilert_ctrl_port": v15.ctrl_port},
        },
    )
    (sent,) = await settled_transfers(client, prefill.url, 1)
    assert sent["outcome"] == "written_while_busy"
    assert sent["refusal"] == {"error": "busy", "busy_rid": holder}
    (corruption,) = (await _records(client, v15))["corruptions"]
    assert (corruption["rid"], corruption["busy_rid"], corruption["kind"]) == (
        sent["rid"],
        holder,
        "write_while_busy",
    )
    assert await opened.done() is None
    await decode_stream(client, v15, holder, 5)
    decodes = (await _records(client, v15))["decodes"]
    assert decodes[-1]["corrupted"] is True


async def test_v15_answers(client: httpx.AsyncClient, v15: NodeInfo) -> None:
    assert (await client.get(f"{v15.url}/capabilities")).status_code == 404
    assert (await client.post(f"{v15.url}/pd/decode", json={"rid": "x"})).status_code == 422
    rid = new_rid()
    opened = await transfer_open(v15, rid, seq_len=30, plan=[5, 6, 7, EOS])
    assert "protocol_version" not in opened.hello and "senders" not in opened.hello
    # A done naming another rid completes the slot's rid.
    await write_frame(opened.writer, {"done": True, "rid": "someone-else", "rank": 0})
    assert await read_frame(opened.reader) is None
    await close_quietly(opened.writer)
    reader, writer = await asyncio.open_connection(v15.host, v15.ctrl_port)
    hello = await read_frame(reader)
    await close_quietly(writer)
    assert hello is not None and hello["busy"] is False  # a complete transfer is not busy
    body = (await _decode(client, v15, rid, sampling={"temperature": 0.7})).json()
    assert (body["token_ids"], body["seq_len"]) == ([5, 6, 7], 30)
    assert set(body["timing_ms"]) == {"wire_wait", "convert", "inject", "decode", "finish_reason"}
    sampling = (await _records(client, v15))["decodes"][-1]["sampling"]
    assert (sampling["top_p"], sampling["top_k"]) == (0.95, 256)
    other = new_rid()
    await transfer(v15, other, plan=[5, 6, EOS])
    zero = await _decode(client, v15, other, max_tokens=0)
    assert (zero.status_code, zero.json()["token_ids"]) == (200, [5])  # the first token alone


# -- 0.1.6 ---------------------------------------------------------------------------


async def test_v16_cancel_during_the_kv_wait_answers_499(
    client: httpx.AsyncClient, v16: NodeInfo
) -> None:
    rid = new_rid()
    pending = asyncio.ensure_future(_decode(client, v16, rid, timeout_s=5))
    await _waiting(client, v16, rid)
    assert (await client.post(f"{v16.url}/pd/cancel", json={"rid": rid})).json() == {
        "cancelled": rid
    }
    response = await pending
    assert response.status_code == 499
    assert response.json()["error_type"] == "request_cancelled"


async def test_v16_release_frees_only_its_own_rid_then_refuses_it(
    client: httpx.AsyncClient, v16: NodeInfo
) -> None:
    holder, failed = new_rid(), new_rid()
    opened = await transfer_open(v16, holder, plan=[5, 6, EOS])
    assert (await _decode(client, v16, failed, timeout_s=0.05)).status_code == 504
    assert await opened.done() is None
    assert (await decode_stream(client, v16, holder, 5)).ids == [5, 6]
    late = await transfer_open(v16, failed)
    assert late.admission == {
        "accepted": False,
        "error": "cancelling",
        "rid": failed,
        "detail": "no_consumer",
    }
    await late.answer()


async def test_v16_a_complete_transfer_counts_as_free_and_is_overwritten(
    client: httpx.AsyncClient, v16: NodeInfo
) -> None:
    first, second = new_rid(), new_rid()
    await transfer(v16, first, plan=[5, EOS])
    await transfer(v16, second, plan=[6, EOS])
    (corruption,) = (await _records(client, v16))["corruptions"]
    assert (corruption["rid"], corruption["busy_rid"], corruption["kind"]) == (
        second,
        first,
        "overwrote_complete",
    )


async def test_v16_a_lost_sender_keeps_the_slot_transferring(
    client: httpx.AsyncClient, v16: NodeInfo
) -> None:
    lost, other = new_rid(), new_rid()
    opened = await transfer_open(v16, lost)
    await opened.drop()  # the sender goes away without done
    refused = await transfer_open(v16, other)
    assert refused.admission is not None
    assert (refused.admission["error"], refused.admission["busy_state"]) == ("busy", "transferring")
    await refused.answer()
    assert (await _decode(client, v16, lost, timeout_s=0.05)).status_code == 504
    await transfer(v16, other)  # its decode released the slot


@pytest.mark.parametrize(
    ("body", "status", "error_type"),
    [
        ({"sampling": {"temperature": "hot"}}, 400, "invalid_parameter"),
        ({"sampling": {"repetition_penalty": 1.2}}, 501, "capability_unavailable"),
        ({"sampling": {"min_p": 0.1}}, 501, "capability_unavailable"),
        ({"grammar_spec": {"type": "json_schema", "value": DEEP}}, 400, "invalid_grammar"),
        ({"grammar_spec": {"type": "regex", "value": "a+"}}, 501, "grammar_unsupported"),
    ],
)
async def test_v16_typed_refusals_drain_the_own_transfer_first(
    client: httpx.AsyncClient, v16: NodeInfo, body: dict[str, Any], status: int, error_type: str
) -> None:
    rid = new_rid()
    opened = await transfer_open(v16, rid, plan=[5, EOS])
    pending = asyncio.ensure_future(_decode(client, v16, rid, **body))
    await _waiting(client, v16, rid)
    await asyncio.sleep(0.1)
    assert not pending.done()  # holding the lock while it drains its transfer
    assert await opened.done() is None
    response = await pending
    assert (response.status_code, response.json()["error_type"]) == (status, error_type)
    assert (await _records(client, v16))["slot"]["state"] == "free"


async def test_v16_capabilities_flip_at_runtime(client: httpx.AsyncClient, v16: NodeInfo) -> None:
    body = (await client.get(f"{v16.url}/capabilities")).json()
    assert body == {
        "profile": "glm5",
        "engine": "SimEngine",
        "capabilities": {"penalties": False, "ignore_eos": True, "logprobs": True, "grammar": True},
    }
    try:
        await client.post(f"{v16.url}/sim/capabilities", json={"logprobs": False, "grammar": False})
        for extra, error_type in (
            ({"top_logprobs": 2}, "logprobs_unavailable"),
            ({"grammar_spec": {"type": "json_object", "value": None}}, "grammar_unsupported"),
        ):
            response = await _decode(client, v16, new_rid(), **extra)
            assert (response.status_code, response.json()["error_type"]) == (501, error_type)
    finally:
        await client.post(f"{v16.url}/sim/capabilities", json={"logprobs": True, "grammar": True})


async def test_v16_stream_batching_logprobs_and_sampling_defaults(
    client: httpx.AsyncClient, v16: NodeInfo
) -> None:
    rid = new_rid()
    await transfer(v16, rid, plan=[*range(100, 140), EOS])
    spec = {"type": "json_schema", "value": {"type": "object"}}
    result = await decode_stream(
        client, v16, rid, 100, top_logprobs=3, grammar_spec=spec, sampling={"temperature": 0.7}
    )
    lines = result.lines[:-1]
    assert lines[0]["t"] == [100]
    assert len(lines) < 40  # batched, not a line per step
    assert result.ids == list(range(100, 140))
    for line in lines:
        assert len(line["lp"]) == len(line["tp"]) == len(line["t"])
        for token, top in zip(line["t"], line["tp"], strict=True):
            assert [pair[0] for pair in top] == [token, token + 1, token + 2]
            assert top == sorted(top, key=lambda pair: -pair[1])
    sampling = (await _records(client, v16))["decodes"][-1]["sampling"]
    assert (sampling["top_p"], sampling["top_k"]) == (1.0, None)
    other = new_rid()
    await transfer(v16, other, plan=[7, 8, EOS])
    body = (await _decode(client, v16, other, top_logprobs=1)).json()
    logprobs = body["logprobs"]
    assert logprobs["lp"] == [logprobs["tp"][i][0][1] for i in range(2)]


# -- connectors and mismatches ----------------------------------------------------------


async def _prefill(
    client: httpx.AsyncClient, prefill_url: str, node: NodeInfo, timeout_s: float = 2.0
) -> tuple[int, dict[str, Any]]:
    try:
        result = await latency_request(client, prefill_url, node, "chat", CHAT, timeout_s=timeout_s)
    except AssertionError:
        raise
    (sent, *_) = await settled_transfers(client, prefill_url, 1)
    return result.decode.status, sent


async def test_v16_connector_retries_busy_until_admitted(
    client: httpx.AsyncClient, stack: SimStack, v16: NodeInfo
) -> None:
    holder = new_rid()
    opened = await transfer_open(v16, holder)
    task = asyncio.ensure_future(_prefill(client, stack.prefills[1].url, v16))
    await asyncio.sleep(0.2)
    assert await opened.done() is None
    status, sent = await task
    assert (status, sent["outcome"]) == (200, "complete")
    assert sent["attempts"] > 1


async def test_v16_connector_refuses_a_v15_node(
    client: httpx.AsyncClient, stack: SimStack, v15: NodeInfo
) -> None:
    status, sent = await _prefill(client, stack.prefills[1].url, v15, timeout_s=0.3)
    assert (status, sent["outcome"]) == (504, "protocol_mismatch")


async def test_v15_connector_against_v16_nodes(client: httpx.AsyncClient, stack: SimStack) -> None:
    prefill = stack.prefills[0].url
    status, sent = await _prefill(client, prefill, stack.nodes[1])
    assert (status, sent["outcome"]) == (200, "complete")  # one sender, same layout: works
    await client.post(f"{prefill}/sim/reset")
    status, _ = await _prefill(client, prefill, stack.nodes[2], timeout_s=0.3)
    assert status == 504  # the node waits for 8 senders
