"""The gate suite runs against the `Gate` interface, once per state backend."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from router.config import GateConfig, NodeConfig
from router.gate import Gate, make_gate

MakeGate = Callable[..., Gate]
BACKENDS = ["memory"]


def nodes(n: int) -> list[NodeConfig]:
    return [NodeConfig(host="127.0.0.1", http_port=6000 + i, ctrl_port=7000 + i) for i in range(n)]


@pytest.fixture(params=BACKENDS)
def gate_of(request: pytest.FixtureRequest) -> MakeGate:
    """`gate_of(node_list, max_queue=..., failure_threshold=..., cooldown_s=...)`."""
    backend = request.param

    def build(
        node_list: list[NodeConfig],
        *,
        max_queue: int,
        failure_threshold: int = 3,
        cooldown_s: float = 5.0,
    ) -> Gate:
        config = GateConfig(
            backend=backend,
            max_queue=max_queue,
            failure_threshold=failure_threshold,
            node_cooldown_s=cooldown_s,
        )
        return make_gate(config, node_list)

    return build
