"""A TileRT decode node as the running gateway knows it: where to reach it, the release it
must run and the pool it serves.

Built from the configuration (and from DNS, for discovered nodes) at load and reload, and
passed between the gate, the node protocol and the prober. It is not the configuration's
`NodeConfig`: a setting renamed in `router.yaml` changes how this is built, not the node
every other module works on.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.config import LatencyConfig, LatencyPoolConfig, NodeConfig, TileRTVersion


@dataclass(frozen=True, slots=True)
class Node:
    host: str
    ctrl_port: int = 5556
    http_port: int = 5557
    name: str | None = None
    tilert: TileRTVersion | None = None
    """The TileRT release the node must run: its pool's."""
    pool: str | None = None
    """The name of the pool the node belongs to."""

    @property
    def id(self) -> str:
        return self.name or f"{self.host}:{self.http_port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @classmethod
    def of_pool(cls, pool: LatencyPoolConfig, node: NodeConfig) -> Node:
        """A configured (or discovered) node as a member of `pool`."""
        return cls(
            host=node.host,
            ctrl_port=node.ctrl_port,
            http_port=node.http_port,
            name=node.name,
            tilert=pool.tilert,
            pool=pool.name,
        )


def configured_nodes(latency: LatencyConfig) -> list[Node]:
    """Every node listed in the latency path's pools."""
    return [Node.of_pool(pool, node) for pool in latency.pools for node in pool.nodes]
