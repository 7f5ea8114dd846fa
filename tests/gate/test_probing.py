"""The prober on every gate backend: a node busy at its first probe is readmitted at the
next (its claim given back), and a node of the wrong release found while held leaves
service at its release, logged once."""

from __future__ import annotations

import logging

import pytest

from router.gate import GateRejected, NodeFailure
from router.node import Node
from router.node_lifecycle.facts import NodeFactsBook
from router.node_lifecycle.prober import MISMATCH_LINES, _probe_out_node, learn
from router.telemetry.metrics import Metrics
from tests.gate.conftest import MakeGate
from tests.support.scripted_node import ScriptedNode, upstreams

NODE = Node(host="node", http_port=5557, tilert="0.1.6")
METRICS = Metrics()

UNFINISHED = NodeFailure("decode_unfinished", hard=True)


async def test_a_node_busy_at_its_first_probe_is_readmitted_at_the_next(
    gate_of: MakeGate,
) -> None:
    node, facts = ScriptedNode(), NodeFactsBook()
    gate = gate_of([NODE], max_queue=4, cooldown_s=0)
    lease = await gate.acquire(priority=0, wait_s=1, holder="a")
    await lease.release(UNFINISHED)
    node.status = "busy"
    await _probe_out_node(gate, upstreams(node), facts, METRICS, "glm", NODE)
    assert node.decodes == [] and NODE.id in (await gate.snapshot()).out
    node.status = "idle"
    await _probe_out_node(gate, upstreams(node), facts, METRICS, "glm", NODE)
    assert len(node.decodes) == 1
    assert (await gate.snapshot()).out == {}


async def test_a_node_of_another_release_found_while_held_leaves_at_its_release(
    gate_of: MakeGate, caplog: pytest.LogCaptureFixture
) -> None:
    node, facts = ScriptedNode(capabilities=(404, {"detail": "Not Found"})), NodeFactsBook()
    other = Node(host="other", http_port=5557, tilert="0.1.6")
    gate = gate_of([NODE, other], max_queue=4, cooldown_s=0)
    held = await gate.acquire(priority=0, wait_s=1, holder="a")
    assert held.node == NODE
    MISMATCH_LINES.clear(NODE.id)
    with caplog.at_level(logging.ERROR, logger="pd_gateway.health"):
        for _ in range(5):
            assert await learn(gate, upstreams(node), facts, NODE) is False
    reason = "tilert_version_mismatch: node runs 0.1.5, pool is 0.1.6"
    assert [r.getMessage() for r in caplog.records] == [
        f"node {NODE.id}: {reason}; out of service once free"
    ]
    assert (await gate.snapshot()).out == {NODE.id: reason}
    await held.release()
    lease = await gate.acquire(priority=0, wait_s=0, holder="b")
    assert lease.node == other
    with pytest.raises(GateRejected) as refused:  # the node of another release serves no one
        await gate.acquire(priority=0, wait_s=0, holder="c")
    assert refused.value.reason == "pool_saturated"
    await lease.release()
