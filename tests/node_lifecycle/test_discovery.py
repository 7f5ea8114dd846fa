"""Nodes found by DNS: they join and leave the pool as the name's addresses change, and a
failed lookup changes nothing."""

from __future__ import annotations

import pytest

from router.config import GateConfig, LatencyConfig
from router.gate import make_gate
from router.node_lifecycle.discovery import Discovery, resolve_addresses
from router.node_lifecycle.facts import NodeFactsBook

LATENCY = LatencyConfig.model_validate(
    {
        "pools": [
            {
                "name": "tilert",
                "tilert": "0.1.5",
                "prefill": ["http://prefill:8000"],
                "nodes": [{"host": "static"}],
                "discover": {"dns": "tilert-decode", "ctrl_port": 6000, "http_port": 6001},
            }
        ]
    }
)


class Dns:
    def __init__(self) -> None:
        self.answers: list[str] | OSError = []
        self.asked: list[tuple[str, str]] = []

    async def __call__(self, name: str, family: str) -> list[str]:
        self.asked.append((name, family))
        if isinstance(self.answers, OSError):
            raise self.answers
        return self.answers


async def test_addresses_join_and_leave_the_pool() -> None:
    dns, facts = Dns(), NodeFactsBook()
    gate = make_gate(GateConfig(), LATENCY.nodes)
    discovery = Discovery("m", lambda: LATENCY, gate, facts, resolve=dns)
    dns.answers = ["10.0.0.1", "10.0.0.2"]
    assert await discovery.refresh() is True
    assert dns.asked == [("tilert-decode", "any")]
    assert [n.id for n in await gate.nodes()] == ["static:5557", "10.0.0.1:6001", "10.0.0.2:6001"]
    found = discovery.found()
    assert {(n.ctrl_port, n.tilert, n.pool) for n in found} == {(6000, "0.1.5", "tilert")}
    assert facts.members["m"] == ["static:5557", "10.0.0.1:6001", "10.0.0.2:6001"]
    assert await discovery.refresh() is False  # the same answer: nothing to do

    leases = [await gate.acquire(priority=0, wait_s=0, holder=f"r{i}") for i in range(3)]
    dns.answers = ["10.0.0.2"]  # 10.0.0.1 left, while serving a request
    assert await discovery.refresh() is True
    assert (await gate.snapshot()).busy["10.0.0.1:6001"] is not None  # finishing it
    for lease in leases:
        await lease.release()
    assert [n.id for n in await gate.nodes()] == ["static:5557", "10.0.0.2:6001"]
    assert "10.0.0.1:6001" not in (await gate.snapshot()).busy


async def test_a_failed_lookup_keeps_the_pool_as_it_is() -> None:
    dns = Dns()
    gate = make_gate(GateConfig(), LATENCY.nodes)
    discovery = Discovery("m", lambda: LATENCY, gate, NodeFactsBook(), resolve=dns)
    dns.answers = ["10.0.0.1"]
    await discovery.refresh()
    dns.answers = OSError("Name or service not known")
    assert await discovery.refresh() is False
    assert [n.id for n in await gate.nodes()] == ["static:5557", "10.0.0.1:6001"]


async def test_the_system_resolver_answers_for_this_host() -> None:
    assert await resolve_addresses("localhost", "ipv4") == ["127.0.0.1"]


def test_a_pool_needs_nodes_or_a_name_to_find_them() -> None:
    with pytest.raises(ValueError, match="needs `nodes`, `discover` or both"):
        LatencyConfig.model_validate({"prefill": ["http://p:1"]})
