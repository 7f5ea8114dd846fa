"""An upgrade in progress: a pool of TileRT 0.1.5 nodes and a pool of 0.1.6 nodes behind one
gateway, each with its own prefill server. A request's prefill always goes to its node's
pool, and a node configured into the wrong pool is taken out with its reason."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest

from sim.stack import SimStack
from tests.support.deployment import (
    corruptions,
    directive,
    node_entry,
    reset,
    sim_get,
    version_args,
)
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.stacks import StackPool

MODEL = "m"
TEXT = "one model, two releases"


def start_stack(sim_stacks: StackPool, version: str, nodes: int) -> SimStack:
    args = version_args(version)
    return sim_stacks.get(
        nodes=nodes,
        prefills=1,
        model=MODEL,
        node_args=["--step-ms", "2", *args["node_args"]],
        prefill_args=["--itl-ms", "0", *args["prefill_args"]],
    )


@pytest.fixture(scope="module")
def old(sim_stacks: StackPool) -> SimStack:
    """Two 0.1.5 nodes: the first in its own pool, the second wrongly in the 0.1.6 pool."""
    return start_stack(sim_stacks, "0.1.5", 2)


@pytest.fixture(scope="module")
def new(sim_stacks: StackPool) -> SimStack:
    return start_stack(sim_stacks, "0.1.6", 1)


@pytest.fixture(scope="module")
def gateway(
    old: SimStack, new: SimStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    pools = [
        {
            "name": "old",
            "tilert": "0.1.5",
            "prefill": [old.prefills[0].url],
            "nodes": [node_entry(old.nodes[0])],
        },
        {
            "name": "new",
            "tilert": "0.1.6",
            "prefill": [new.prefills[0].url],
            "nodes": [node_entry(new.nodes[0]), node_entry(old.nodes[1])],
        },
    ]
    model = {"name": MODEL, "tokenizer": "deepseek", "latency": {"pools": pools}}
    with start_gateway(tmp_path_factory, [model]) as running:
        yield running


def node_id(stack: SimStack, index: int) -> str:
    return f"{stack.nodes[index].host}:{stack.nodes[index].http_port}"


def ctrl_ports_named(stack: SimStack) -> set[int]:
    """The node control ports the stack's prefill server was told to push KV state to."""
    requests = sim_get(stack.prefills[0].url, "/sim/requests")["requests"]
    return {r["body"]["kv_transfer_params"]["tilert_ctrl_port"] for r in requests}


async def test_each_request_is_prefilled_by_its_nodes_pool(
    old: SimStack, new: SimStack, gateway: GatewayProcess
) -> None:
    reset(old)
    reset(new)
    async with openai.AsyncOpenAI(
        base_url=gateway.base_url, api_key="unused", max_retries=0
    ) as client:

        async def ask() -> str | None:
            answer = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": directive(TEXT)}]
            )
            return answer.choices[0].message.content

        answers = await asyncio.gather(*(ask() for _ in range(12)))
    assert answers == [TEXT] * 12
    gateway.wait_all_free(dead=[node_id(old, 1)])
    assert ctrl_ports_named(old) == {old.nodes[0].ctrl_port}
    assert ctrl_ports_named(new) == {new.nodes[0].ctrl_port}
    assert sim_get(old.nodes[1].url, "/sim/records")["decodes"] == []
    assert corruptions(old) == corruptions(new) == []


def test_a_node_of_the_wrong_release_is_out_with_its_reason(
    old: SimStack, new: SimStack, gateway: GatewayProcess
) -> None:
    pool = gateway.pool()["models"][MODEL]
    assert pool["out"] == {
        node_id(old, 1): "tilert_version_mismatch: node runs 0.1.5, pool is 0.1.6"
    }
    facts = pool["node_facts"]
    assert facts[node_id(old, 0)]["tilert"] == "0.1.5"
    assert facts[node_id(new, 0)]["tilert"] == "0.1.6"
    assert facts[node_id(old, 1)] == {
        "expected": "0.1.6",
        "tilert": None,
        "features": [],
        "engine": None,
    }
