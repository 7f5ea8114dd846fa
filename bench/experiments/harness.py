"""What the experiments share: `pd-gateway serve` as a child process on a free loopback
port (the one `pd-gateway bench` runs), and the router.yaml model entry for a simulated
stack's latency path."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.processes import GatewayChild, rss_mb
from sim.stack import SimStack


def latency_model(
    stack: SimStack, name: str, nodes: SimStack | None = None, **entry: Any
) -> dict[str, Any]:
    """A model served by `stack`'s prefill servers and TileRT nodes (`nodes`' nodes if
    another stack runs them), DeepSeek tokenizer."""
    return {
        "name": name,
        "tokenizer": "deepseek",
        "latency": {
            "prefill": [p.url for p in stack.prefills],
            "nodes": [
                {"host": n.host, "ctrl_port": n.ctrl_port, "http_port": n.http_port}
                for n in (nodes or stack).nodes
            ],
        },
        **entry,
    }


class BenchGateway(GatewayChild):
    """`pd-gateway serve` as installed, or from the checkout at `root`."""

    def peak_rss_mb(self) -> float:
        return rss_mb(self.pid, "VmHWM")


@contextmanager
def running_gateways(
    config: dict[str, Any], roots: dict[str, Path | None] | None = None
) -> Iterator[dict[str, BenchGateway]]:
    """One gateway per label, all with `config`: each from its checkout, or as installed
    (None; by default one such, as `gateway`); stopped on the way out. Wait for each with
    `wait_ready`."""
    roots = roots or {"gateway": None}
    with tempfile.TemporaryDirectory(prefix="pd-gateway-bench-") as workdir:
        gateways: dict[str, BenchGateway] = {}
        try:
            for label, root in roots.items():
                gateways[label] = BenchGateway(config, Path(workdir) / label, root)
            yield gateways
        finally:
            for gateway in gateways.values():
                gateway.stop()
