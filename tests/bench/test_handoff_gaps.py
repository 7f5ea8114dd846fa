"""The hand-off gaps read from the simulators' records: each ended decode on a node to the
first prefill naming that node after it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bench.handoff import NodeQueue, gaps
from sim.stack import NodeInfo

A, B = ("10.0.0.1", 5000), ("10.0.0.2", 5000)


def prefill(node: tuple[str, int], received: float) -> dict[str, Any]:
    params = {"tilert_host": node[0], "tilert_ctrl_port": node[1]}
    return {"body": {"kv_transfer_params": params}, "received": received}


def decode(end: float | None) -> dict[str, Any]:
    return {"end": end}


def test_each_decode_end_meets_the_next_prefill_on_its_own_node() -> None:
    prefills = [prefill(A, 1.0), prefill(B, 1.1), prefill(A, 2.25), prefill(B, 3.5)]
    decodes = {A: [decode(1.5), decode(2.75)], B: [decode(3.0)]}
    assert gaps(prefills, decodes) == pytest.approx([0.75, 0.5])  # A's last has no successor


def test_decodes_that_never_ended_and_prefills_for_no_node_are_left_out() -> None:
    prefills = [
        prefill(A, 2.0),
        {"body": {"model": "m"}, "received": 1.2},  # a native-path request
        {"body": None, "received": 1.3},
    ]
    decodes = {A: [decode(None), decode(1.0)], B: [decode(1.1)]}
    assert gaps(prefills, decodes) == pytest.approx([1.0])


async def test_a_node_given_back_goes_to_the_longest_waiter_not_back_to_its_giver() -> None:
    """Two clients, one node: each takes it in turn, however fast the giver asks again."""
    node = NodeInfo("127.0.0.1", 1, 2, None, 0)
    queue, order = NodeQueue([node]), []
    both_asking = asyncio.Event()

    async def client(name: str, asking: list[str]) -> None:
        for _ in range(3):
            asking.append(name)
            if len(asking) == 2:
                both_asking.set()

            async def request(_: NodeInfo) -> None:
                order.append(name)
                await both_asking.wait()

            await queue.run(request)

    asking: list[str] = []
    await asyncio.gather(client("a", asking), client("b", asking))
    assert order == ["a", "b", "a", "b", "a", "b"]


def test_a_stream_ends_at_its_last_write_even_if_its_end_was_noted_after_the_next_prefill() -> None:
    """A node preempted between its last write and noting `end` notes it after the next
    prefill has arrived: the last write still pairs the two."""
    prefills = [prefill(A, 1.0), prefill(A, 2.0)]
    decodes = {A: [{"end": 2.5, "last_write": 1.5}]}
    assert gaps(prefills, decodes) == pytest.approx([0.5])
