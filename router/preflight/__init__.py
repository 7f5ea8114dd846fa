"""`pd-gateway check --probe`: reach every backend the configuration names, as the gateway
would, and say in one line each what it found.

`nodes` asks each TileRT node for its release and features, `servers` each vLLM server and
proxy for its health, load and models, `gate` connects to the gate's Redis and loads its
scripts. Each returns 1 if what it reached is unusable, else 0.
"""

from __future__ import annotations

import asyncio

from router.config import GatewayConfig
from router.preflight.gate import probe_gate
from router.preflight.nodes import probe_nodes
from router.preflight.servers import probe_servers, probing_upstreams

__all__ = ["probe"]


def probe(config: GatewayConfig) -> int:
    """Every probe, one line per backend; 1 if any backend is unusable, else 0."""
    backends = asyncio.run(_probe_backends(config))
    return max(backends, probe_gate(config))


async def _probe_backends(config: GatewayConfig) -> int:
    upstreams = probing_upstreams(config)
    try:
        nodes = await probe_nodes(config, upstreams)
        servers = await probe_servers(config, upstreams)
    finally:
        await upstreams.aclose()
    return max(nodes, servers)
