"""Node and connector options end to end: several sender ranks, no data plane, checks."""

import httpx
import pytest

from sim.stack import SimStack
from tests.support.stacks import StackPool

from .sim_support import (
    decode_stream,
    latency_request,
    new_rid,
    reset_stack,
    settled_transfers,
    transfer_open,
)

pytestmark = pytest.mark.e2e

FAST = ["--itl-ms", "0", "--prefill-ms-per-token", "0"]
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=3,
        prefills=2,
        node_args=["--step-ms", "1"],
        prefill_args=FAST,
        instance_args={
            "node-0": ["--sender-ranks", "0,1"],
            "prefill-0": ["--sender-ranks", "0,1"],
            "node-1": ["--no-data-plane", "--max-seq-len", "64"],
            "node-2": ["--layout-version", "2"],
        },
    )


async def test_every_sender_rank_transfers(client: httpx.AsyncClient, stack: SimStack) -> None:
    prefill, node = stack.prefills[0], stack.nodes[0]
    result = await latency_request(client, prefill.url, node, "chat", CHAT)
    assert result.decode.final["finish_reason"] == "stop"
    transfers = await settled_transfers(client, prefill.url, 2)
    assert sorted((t["rank"], t["outcome"]) for t in transfers) == [
        (0, "complete"),
        (1, "complete"),
    ]
    control = (await client.get(f"{node.url}/sim/records")).json()["control"]
    outcomes = sorted((c["rank"], c["outcome"]) for c in control)
    assert outcomes.count((0, "accepted")) == outcomes.count((1, "accepted")) == 1
    assert [c["outcome"] for c in control].count("complete") == 1


async def test_a_transfer_is_complete_only_when_every_rank_is_done(
    client: httpx.AsyncClient, stack: SimStack
) -> None:
    node, rid = stack.nodes[0], new_rid()
    rank0 = await transfer_open(node, rid, rank=0, plan=[20, 21, 1])
    assert await rank0.done() is None
    slot = (await client.get(f"{node.url}/sim/records")).json()["slot"]
    assert (slot["rid"], slot["state"], slot["queued"]) == (rid, "transferring", [])
    rank1 = await transfer_open(node, rid, rank=1)
    assert await rank1.done() is None
    assert (await decode_stream(client, node, rid, 20)).ids == [20, 21]


async def test_without_a_data_plane_the_node_decodes_filler(
    client: httpx.AsyncClient, stack: SimStack
) -> None:
    prefill, node = stack.prefills[1], stack.nodes[1]
    opened = await transfer_open(node, new_rid())
    assert "sim_data_plane" not in opened.hello
    await opened.done()
    await reset_stack(client, stack)
    result = await latency_request(client, prefill.url, node, "chat", CHAT)
    assert result.decode.ids[0] == result.first
    assert len(result.decode.ids) == 48


@pytest.mark.parametrize(
    ("node_index", "content", "outcome"),
    [(1, "long " * 100, "seq_len_exceeds"), (2, "Hi", "hello_mismatch")],
)
async def test_the_sender_checks_the_hello(
    client: httpx.AsyncClient, stack: SimStack, node_index: int, content: str, outcome: str
) -> None:
    prefill, node = stack.prefills[1], stack.nodes[node_index]
    kv = {"tilert_host": node.host, "tilert_ctrl_port": node.ctrl_port}
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 1,
        "kv_transfer_params": kv,
    }
    response = await client.post(f"{prefill.url}/v1/chat/completions", json=body)
    assert response.status_code == 200  # a connector failure never fails the prefill
    transfers = await settled_transfers(client, prefill.url, 1)
    assert [t["outcome"] for t in transfers] == [outcome]
