"""The prober against scripted nodes: facts learned, a node of the wrong release taken out,
an out node flushed before it is readmitted, and nothing flushed that is not claimed (on
every gate backend: tests/gate/test_probing.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from router.config import GateConfig
from router.config.settings import TileRTVersion
from router.gate import ProbeClaim, make_gate
from router.node import Node
from router.node_lifecycle.facts import NodeFactsBook
from router.node_lifecycle.prober import _probe_out_node, admit_ready_nodes
from router.telemetry.metrics import Metrics
from tests.support.scripted_node import ScriptedNode, upstreams

NODE = Node(host="node", http_port=5557, tilert="0.1.6")
METRICS = Metrics()
MODEL = "glm"


async def test_start_up_learns_the_facts_and_flushes_each_node_it_owns() -> None:
    node, facts = ScriptedNode(), NodeFactsBook()
    gate = make_gate(GateConfig(), [NODE])
    await admit_ready_nodes(gate, upstreams(node), facts, Metrics(), sole_user=True)
    assert facts.features([NODE.id]) == {"logprobs"}
    assert [d["rid"].startswith("pdgwflush") for d in node.decodes] == [True]
    assert node.decodes[0]["max_tokens"] == 1 and node.decodes[0]["stream"] is False
    assert (await gate.snapshot()).out == {}


async def test_a_shared_pool_is_not_flushed_at_start_up() -> None:
    node = ScriptedNode()
    gate = make_gate(GateConfig(), [NODE])
    await admit_ready_nodes(gate, upstreams(node), NodeFactsBook(), Metrics(), sole_user=False)
    assert node.decodes == []


async def test_a_node_of_another_release_is_taken_out_with_the_reason() -> None:
    node, facts = ScriptedNode(capabilities=(404, {"detail": "Not Found"})), NodeFactsBook()
    gate = make_gate(GateConfig(), [NODE])
    await admit_ready_nodes(gate, upstreams(node), facts, Metrics(), sole_user=True)
    assert (await gate.snapshot()).out == {
        NODE.id: "tilert_version_mismatch: node runs 0.1.5, pool is 0.1.6"
    }
    assert node.decodes == [] and facts.get(NODE.id) is None
    await _probe_out_node(
        gate, upstreams(node), facts, METRICS, MODEL, NODE
    )  # still 0.1.5: stays out
    assert NODE.id in (await gate.snapshot()).out


async def test_an_out_node_is_flushed_then_readmitted_once_idle() -> None:
    node, facts = ScriptedNode(), NodeFactsBook()
    gate = make_gate(GateConfig(node_cooldown_s=0), [NODE])
    await gate.take_out(NODE.id, "decode_unfinished")
    node.status = "busy"
    await _probe_out_node(gate, upstreams(node), facts, METRICS, MODEL, NODE)
    assert node.decodes == [] and NODE.id in (await gate.snapshot()).out  # busy: not touched
    node.status = "idle"
    metrics = Metrics()
    await _probe_out_node(gate, upstreams(node), facts, metrics, MODEL, NODE)
    assert len(node.decodes) == 1
    assert (await gate.snapshot()).out == {}
    flushes = {"node": NODE.id, "outcome": "clean"}
    assert metrics.registry.get_sample_value("pd_gateway_node_flushes_total", flushes) == 1


async def test_a_node_in_service_is_never_flushed_by_the_prober() -> None:
    node = ScriptedNode()
    gate = make_gate(GateConfig(), [NODE])
    await _probe_out_node(gate, upstreams(node), NodeFactsBook(), METRICS, MODEL, NODE)
    assert node.decodes == []


@dataclass
class StalePool:
    """A pool whose one node is out after a lease expired on it unreleased (the parts of
    `PoolAdmin` the prober uses for an out node)."""

    stale_rid: str
    quiet_s: list[float] = field(default_factory=list)
    readmitted: list[str] = field(default_factory=list)

    async def claim_for_probe(
        self, node_id: str, *, for_s: float, quiet_s: float = 0.0
    ) -> ProbeClaim | None:
        self.quiet_s.append(quiet_s)
        return ProbeClaim(stale_rid=self.stale_rid)

    async def readmit(self, node_id: str) -> None:
        self.readmitted.append(node_id)

    async def release_probe_claim(self, node_id: str) -> None:
        raise AssertionError("an idle node's flush runs")

    async def retire(self, node_id: str, reason: str) -> None:
        raise AssertionError(f"the node is of its pool's release ({reason})")


@pytest.mark.parametrize(
    ("release", "capabilities", "quiet_s"),
    [
        ("0.1.6", None, 0.0),  # flushed in the stale request's name: its transfer is refused
        ("0.1.5", (404, {"detail": "Not Found"}), 600.0),  # takes any: the prefill's deadline
    ],
)
async def test_a_node_whose_lease_expired_is_flushed_in_the_stale_requests_name(
    release: TileRTVersion, capabilities: tuple[int, dict[str, str]] | None, quiet_s: float
) -> None:
    node = ScriptedNode() if capabilities is None else ScriptedNode(capabilities=capabilities)
    pool, pinned = (
        StalePool(stale_rid="stalerid"),
        Node(host="node", http_port=5557, tilert=release),
    )
    scripted = upstreams(node)
    await _probe_out_node(pool, scripted, NodeFactsBook(), METRICS, MODEL, pinned)  # type: ignore[arg-type]
    assert pool.quiet_s == [quiet_s]
    assert [d["rid"] for d in node.decodes] == ["stalerid"]
    assert pool.readmitted == [pinned.id]
    assert node.cancels == []  # nothing of it was running


@pytest.mark.parametrize("release", ["0.1.5", "0.1.6"])
async def test_a_decode_running_on_past_its_lease_is_cancelled_and_the_node_readmitted(
    release: TileRTVersion,
) -> None:
    """Its holder died or is paused: nobody may read it, and left running it would keep the
    node out until its last token."""
    node = ScriptedNode(running="stalerid")
    if release == "0.1.5":
        node.capabilities = (404, {"detail": "Not Found"})
    pool, pinned = (
        StalePool(stale_rid="stalerid"),
        Node(host="node", http_port=5557, tilert=release),
    )
    metrics = Metrics()
    await _probe_out_node(pool, upstreams(node), NodeFactsBook(), metrics, MODEL, pinned)  # type: ignore[arg-type]
    assert node.cancels == ["stalerid"]
    assert [d["rid"] for d in node.decodes] == ["stalerid"]  # then flushed in its name
    assert pool.readmitted == [pinned.id]
    labels = {"model": MODEL, "reason": "lease_expired"}
    assert metrics.registry.get_sample_value("pd_gateway_cancellations_total", labels) == 1


async def test_another_requests_decode_is_never_cancelled() -> None:
    """The node is busy with a decode the expired lease does not name (e.g. a request of a
    replica that does not share this pool's store): it is left alone, and the node stays out."""
    node = ScriptedNode(running="someone-else")
    pool = StalePool(stale_rid="stalerid")
    released: list[str] = []

    async def release_probe_claim(node_id: str) -> None:
        released.append(node_id)

    pool.release_probe_claim = release_probe_claim  # type: ignore[method-assign]
    await _probe_out_node(pool, upstreams(node), NodeFactsBook(), METRICS, MODEL, NODE)  # type: ignore[arg-type]
    assert node.cancels == [] and node.decodes == []
    assert pool.readmitted == [] and released == [NODE.id]
