"""The simulated TileRT node (default protocol, 0.1.6) over real sockets: control plane,
/pd API, faults, records. Version differences and hazards: test_sim_versions.py."""

import asyncio
import json

import httpx
import pytest

from sim.stack import NodeInfo, SimStack
from sim.tokenizers import load_vocab
from tests.support.stacks import StackPool

from .sim_support import (
    decode_stream,
    new_rid,
    transfer,
    transfer_open,
    wait_until,
)

pytestmark = pytest.mark.e2e

EOS = load_vocab("deepseek").eos_ids[0]


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    node_args = ["--step-ms", "1", "--stream-interval-ms", "20"]
    return sim_stacks.get(nodes=1, prefills=0, node_args=node_args)


@pytest.fixture
def node(stack: SimStack) -> NodeInfo:
    return stack.nodes[0]


async def _records(client: httpx.AsyncClient, node: NodeInfo) -> dict:
    return (await client.get(f"{node.url}/sim/records")).json()


async def _status(client: httpx.AsyncClient, node: NodeInfo) -> dict:
    return (await client.get(f"{node.url}/decode_status")).json()


async def _idle(client: httpx.AsyncClient, node: NodeInfo) -> None:
    async def idle() -> bool:
        return (await _status(client, node))["status"] == "idle"

    await wait_until(idle)


async def test_hello_carries_the_contract_and_the_data_plane(node: NodeInfo) -> None:
    opened = await transfer_open(node, new_rid())
    assert opened.hello == {
        "magic": "tilert-pd",
        "protocol_version": 2,
        "layout_version": 1,
        "transport": "mooncake",
        "max_seq_len": 131072,
        "busy": False,
        "sim_data_plane": {"host": node.host, "port": node.data_port},
        "senders": 1,
    }
    assert opened.admission is not None
    assert opened.admission == {
        "accepted": True,
        "rid": opened.rid,
        "rank": 0,
        "generation": opened.admission["generation"],
    }
    assert await opened.done() is None


async def test_transfer_then_streamed_decode(client: httpx.AsyncClient, node: NodeInfo) -> None:
    rid = new_rid()
    await transfer(node, rid, plan=[5, 6, 7, 8, 9, 10, 11, EOS, 12], seq_len=20)
    result = await decode_stream(client, node, rid, 5)
    assert result.ids == [5, 6, 7, 8, 9, 10, 11]
    assert result.lines[0] == {"t": [5]}  # the first token on a line of its own
    final = result.final
    assert (final["done"], final["n"], final["seq_len"], final["finish_reason"]) == (
        True,
        7,
        20,  # the prompt length
        "stop",
    )
    assert set(final["timing_ms"]) == {"wire_wait", "convert", "inject", "decode", "finish_reason"}
    assert await _status(client, node) == {"status": "idle", "current_rid": None}
    records = await _records(client, node)
    assert [(c["rid"], c["outcome"]) for c in records["control"]] == [
        (rid, "accepted"),
        (rid, "complete"),
    ]
    (decoded,) = records["decodes"]
    assert decoded["finish_reason"] == "stop"
    assert decoded["start"] < decoded["last_write"] <= decoded["end"]
    assert records["max_overlap"] == 1


async def test_non_stream_decode_and_max_tokens(client: httpx.AsyncClient, node: NodeInfo) -> None:
    rid = new_rid()
    await transfer(node, rid, plan=[5, 6, 7, 8, EOS])
    response = await client.post(
        f"{node.url}/pd/decode", json={"rid": rid, "first_token_id": 5, "max_tokens": 3}
    )
    body = response.json()
    assert response.status_code == 200
    assert (body["rid"], body["token_ids"], body["seq_len"]) == (rid, [5, 6, 7], 8)
    assert body["timing_ms"]["finish_reason"] == "length"


async def test_max_tokens_one(client: httpx.AsyncClient, node: NodeInfo) -> None:
    rid = new_rid()
    await transfer(node, rid, plan=[5, 6, EOS])
    result = await decode_stream(client, node, rid, 5, max_tokens=1)
    assert result.lines == [{"t": [5]}, {**result.final, "n": 1, "finish_reason": "length"}]


async def test_max_tokens_zero_is_the_first_token_alone(
    client: httpx.AsyncClient, node: NodeInfo
) -> None:
    """No budget: no token line, and the first token counted (docs/protocols.md §1.5)."""
    rid = new_rid()
    await transfer(node, rid, plan=[5, 6, EOS])
    result = await decode_stream(client, node, rid, 5, max_tokens=0)
    assert result.lines == [{**result.final, "n": 1, "finish_reason": "length"}]
    rid = new_rid()
    await transfer(node, rid, plan=[5, 6, EOS])
    body = {"rid": rid, "first_token_id": 5, "max_tokens": 0}
    whole = (await client.post(f"{node.url}/pd/decode", json=body)).json()
    assert (whole["token_ids"], whole["timing_ms"]["finish_reason"]) == ([5], "length")


async def test_decode_continues_from_the_given_first_token(
    client: httpx.AsyncClient, node: NodeInfo
) -> None:
    rid = new_rid()
    await transfer(node, rid, plan=[5, 6, 7, EOS])
    assert (await decode_stream(client, node, rid, 99)).ids == [99, 6, 7]


async def test_transfer_without_data_plane_state_decodes_filler(
    client: httpx.AsyncClient, node: NodeInfo
) -> None:
    rid = new_rid()
    await transfer(node, rid, plan=None)
    result = await decode_stream(client, node, rid, 1234)
    assert result.ids[0] == 1234
    assert len(result.ids) == 48
    assert result.final["finish_reason"] == "stop"
    assert EOS not in result.ids


async def test_second_rid_refused_while_a_transfer_is_in_progress(
    client: httpx.AsyncClient, node: NodeInfo
) -> None:
    first, second = new_rid(), new_rid()
    opened = await transfer_open(node, first)
    refused = await transfer_open(node, second)
    assert refused.hello["busy"] is True
    assert await refused.answer() == {
        "accepted": False,
        "error": "busy",
        "busy_rid": first,
        "busy_state": "transferring",
    }
    assert await opened.done() is None
    await transfer(node, second)  # the slot is free again once the first completed
    outcomes = [(c["rid"], c["outcome"]) for c in (await _records(client, node))["control"]]
    assert (second, "refused_busy") in outcomes
    assert (second, "complete") in outcomes


async def test_seq_len_over_max_is_refused(node: NodeInfo) -> None:
    rid = new_rid()
    opened = await transfer_open(node, rid, seq_len=131073)
    assert await opened.answer() == {
        "accepted": False,
        "error": "seq_len exceeds max_seq_len",
        "rid": rid,
        "max_seq_len": 131072,
    }


async def test_504_when_no_transfer_arrives(client: httpx.AsyncClient, node: NodeInfo) -> None:
    rid = new_rid()
    response = await client.post(
        f"{node.url}/pd/decode", json={"rid": rid, "first_token_id": 11, "timeout_s": 0.05}
    )
    assert (response.status_code, response.json()) == (
        504,
        {"error": "kv_transfer_timeout", "rid": rid},
    )
    await _idle(client, node)


async def test_decode_waits_for_a_transfer_that_completes_later(
    client: httpx.AsyncClient, node: NodeInfo
) -> None:
    rid = new_rid()
    opened = await transfer_open(node, rid, plan=[3, 4, EOS])
    pending = client.post(f"{node.url}/pd/decode", json={"rid": rid, "first_token_id": 3})
    task = asyncio.ensure_future(pending)

    async def waiting() -> bool:
        return (await _status(client, node))["current_rid"] == rid

    await wait_until(waiting)
    assert not task.done()
    assert await opened.done() is None
    assert (await task).json()["token_ids"] == [3, 4]


async def test_429_while_decoding_and_cancel_mid_stream(
    client: httpx.AsyncClient, node: NodeInfo
) -> None:
    rid, other = new_rid(), new_rid()
    # Long enough (50 s at a step a millisecond) to be cancelled mid-stream even on a
    # machine that stalls the calls below for seconds.
    plan = list(range(100, 50_100))
    await transfer(node, rid, plan=plan)
    payload = {"rid": rid, "first_token_id": 100, "stream": True}
    async with client.stream("POST", f"{node.url}/pd/decode", json=payload) as response:
        lines = response.aiter_lines()
        assert "t" in json.loads(await anext(lines))
        busy = await client.post(f"{node.url}/pd/decode", json={"rid": other, "first_token_id": 11})
        assert (busy.status_code, busy.json()) == (429, {"error": "busy", "current_rid": rid})
        assert (await client.post(f"{node.url}/pd/cancel", json={"rid": other})).status_code == 404
        cancel = await client.post(f"{node.url}/pd/cancel", json={"rid": rid})
        assert cancel.json() == {"cancelled": rid}
        rest = [json.loads(line) async for line in lines if line]
    assert rest[-1]["finish_reason"] == "cancelled"
    assert rest[-1]["n"] < len(plan)
    await _idle(client, node)
    records = await _records(client, node)
    assert records["max_overlap"] == 2  # the refused call overlapped the running one
    assert [d["status"] for d in records["decodes"]] == [200, 429]


async def test_stale_completed_transfer_is_drained(
    client: httpx.AsyncClient, node: NodeInfo
) -> None:
    stale, fresh = new_rid(), new_rid()
    await transfer(node, stale, plan=[11, 12, EOS])
    await transfer(node, fresh, plan=[3, 4, EOS])
    assert (await decode_stream(client, node, fresh, 3)).ids == [3, 4]
    assert (await _records(client, node))["stale_dropped"] == [stale]
    late = await client.post(
        f"{node.url}/pd/decode", json={"rid": stale, "first_token_id": 11, "timeout_s": 0}
    )
    assert late.status_code == 504


async def test_dropping_the_connection_is_not_a_cancel(
    client: httpx.AsyncClient, node: NodeInfo
) -> None:
    await client.post(f"{node.url}/sim/faults", json={"stall_after": 1, "count": 1})
    rid = new_rid()
    await transfer(node, rid, plan=[11, 12, 13, EOS])
    result_lines = []
    async with httpx.AsyncClient() as other:
        payload = {"rid": rid, "first_token_id": 11, "stream": True}
        async with other.stream("POST", f"{node.url}/pd/decode", json=payload) as response:
            async for line in response.aiter_lines():
                result_lines.append(line)
                break
    assert result_lines == ['{"t":[11]}']
    assert await _status(client, node) == {"status": "busy", "current_rid": rid}
    assert (await client.post(f"{node.url}/pd/cancel", json={"rid": rid})).status_code == 200
    await _idle(client, node)


async def test_fault_refuse_transfers_for_the_next_request(
    client: httpx.AsyncClient, node: NodeInfo
) -> None:
    await client.post(f"{node.url}/sim/faults", json={"refuse_transfers": True, "count": 1})
    refused = await transfer_open(node, new_rid())
    assert (await refused.answer())["error"] == "busy"
    await transfer(node, new_rid())


@pytest.mark.parametrize(
    ("fault", "last_line"),
    [({"error_after": 2}, {"error": "decode stalled"}), ({"die_after": 2}, None)],
)
async def test_stream_faults_after_n_tokens(
    client: httpx.AsyncClient, node: NodeInfo, fault: dict, last_line: dict | None
) -> None:
    await client.post(f"{node.url}/sim/faults", json={**fault, "count": 1})
    rid = new_rid()
    await transfer(node, rid, plan=[11, 12, 13, 14, 15, EOS])
    lines = []
    payload = {"rid": rid, "first_token_id": 11, "stream": True}
    try:
        async with client.stream("POST", f"{node.url}/pd/decode", json=payload) as response:
            async for line in response.aiter_lines():
                lines.append(json.loads(line))
    except httpx.RemoteProtocolError:
        pass  # the node "died": the chunked body never ended
    assert lines[:2] == [{"t": [11]}, {"t": [12]}]
    assert lines[2:] == ([last_line] if last_line else [])
    await _idle(client, node)


async def test_fault_http_500_on_decode(client: httpx.AsyncClient, node: NodeInfo) -> None:
    await client.post(f"{node.url}/sim/faults", json={"decode_500": True, "count": 1})
    rid = new_rid()
    await transfer(node, rid, plan=[11, EOS])
    response = await client.post(f"{node.url}/pd/decode", json={"rid": rid, "first_token_id": 11})
    assert response.status_code == 500
    assert response.json()["rid"] == rid
    # As on the real node, a decode that ends in any way released the rid's transfer.
    again = await client.post(
        f"{node.url}/pd/decode", json={"rid": rid, "first_token_id": 11, "timeout_s": 0.2}
    )
    assert again.status_code == 504
    await _idle(client, node)


async def test_fault_slow_start_emits_nothing_before_the_delay(
    client: httpx.AsyncClient, node: NodeInfo
) -> None:
    await client.post(f"{node.url}/sim/faults", json={"slow_start_ms": 60000, "count": 1})
    rid = new_rid()
    await transfer(node, rid, plan=[11, 12, EOS])
    payload = {"rid": rid, "first_token_id": 11, "stream": True}
    async with client.stream("POST", f"{node.url}/pd/decode", json=payload) as response:
        await client.post(f"{node.url}/pd/cancel", json={"rid": rid})
        lines = [json.loads(line) async for line in response.aiter_lines()]
    assert [(line["n"], line["finish_reason"]) for line in lines] == [(0, "cancelled")]


async def test_fault_hold_start_holds_the_decode_until_released(
    client: httpx.AsyncClient, node: NodeInfo
) -> None:
    await client.post(f"{node.url}/sim/faults", json={"hold_start": True, "count": 1})
    rid = new_rid()
    await transfer(node, rid, plan=[11, 12, EOS])
    payload = {"rid": rid, "first_token_id": 11, "stream": True}
    async with client.stream("POST", f"{node.url}/pd/decode", json=payload) as response:
        lines = response.aiter_lines()
        first = asyncio.ensure_future(anext(lines))

        async def held_at_its_start() -> bool:
            return bool((await client.get(f"{node.url}/sim/held")).json()["held"] == 1)

        await wait_until(held_at_its_start)
        status = (await client.get(f"{node.url}/decode_status")).json()
        assert status["status"] == "busy" and not first.done()  # held: nothing sent yet
        assert (await client.get(f"{node.url}/sim/held")).json() == {"held": 1}
        assert (await client.post(f"{node.url}/sim/release")).json() == {"released": 1}
        rest = [json.loads(await first)] + [json.loads(line) async for line in lines]
    assert [line["t"] for line in rest if "t" in line] == [[11], [12]]
    assert rest[-1]["finish_reason"] == "stop"
    assert (await client.post(f"{node.url}/sim/release")).json() == {"released": 0}
    assert (await client.get(f"{node.url}/sim/held")).json() == {"held": 0}
    await _idle(client, node)


async def test_faults_endpoint_validates_and_clears(
    client: httpx.AsyncClient, node: NodeInfo
) -> None:
    bad = await client.post(f"{node.url}/sim/faults", json={"explode": True})
    assert bad.status_code == 400
    armed = await client.post(f"{node.url}/sim/faults", json={"stall_after": 3, "count": 2})
    assert armed.json() == {"faults": {"stall_after": {"value": 3, "remaining": 2}}}
    cleared = await client.delete(f"{node.url}/sim/faults")
    assert cleared.json() == {"faults": {}}


async def test_health_and_bad_decode_body(client: httpx.AsyncClient, node: NodeInfo) -> None:
    assert (await client.get(f"{node.url}/health")).json() == {"status": "ok"}
    response = await client.post(f"{node.url}/pd/decode", json={"first_token_id": 11})
    assert response.status_code == 422  # FastAPI's validation answer


async def test_a_first_token_that_is_eos_decodes_nothing(
    client: httpx.AsyncClient, node: NodeInfo
) -> None:
    rid = new_rid()
    await transfer(node, rid, plan=[EOS])
    result = await decode_stream(client, node, rid, EOS)
    assert result.lines[0] == {"t": [EOS]}  # streamed before the engine checks its stop set
    assert (result.final["n"], result.final["finish_reason"]) == (0, "stop")
