"""What the experiments share: `pd-gateway serve` as a child process on a free loopback
port (the one `pd-gateway bench` runs), and the router.yaml model entry for a simulated
stack's latency path."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench.processes import GatewayChild, rss_mb, stop_all
from sim.stack import NodeInfo, SimStack


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
            "nodes": node_entries((nodes or stack).nodes),
        },
        **entry,
    }


def node_entries(nodes: Sequence[NodeInfo]) -> list[dict[str, Any]]:
    """router.yaml's `latency.nodes` for `nodes`."""
    return [{"host": n.host, "ctrl_port": n.ctrl_port, "http_port": n.http_port} for n in nodes]


def share_of(nodes: Sequence[NodeInfo], index: int, shares: int) -> list[NodeInfo]:
    """The `index`th of `shares` equal shares of `nodes`."""
    size = len(nodes) // shares
    return list(nodes[index * size : (index + 1) * size])


@contextmanager
def started_together(stacks: Sequence[SimStack]) -> Iterator[None]:
    """Every stack started at once (each start waits on its own processes' readiness), and
    all stopped on the way out."""
    with ExitStack() as cleanup:
        for stack in stacks:
            cleanup.callback(stack.stop)
        with ThreadPoolExecutor(len(stacks)) as starting:
            list(starting.map(SimStack.start, stacks))
        yield


class BenchGateway(GatewayChild):
    """`pd-gateway serve` as installed, or from the checkout at `root`."""

    def peak_rss_mb(self) -> float:
        return rss_mb(self.pid, "VmHWM")


class GatewayTurns:
    """Gateways used one after another, one per label, each stopped as its turn ends (and
    whatever is left on the way out).

    With `together`, every one starts on entry and is ready before the first turn: their
    start-ups overlap, and each idles until its turn. Only for gateways with nodes of their
    own: a gateway flushes every node of its pool as it starts, which holds the node for a
    second, and a gateway that finds a node held by another's flush takes it out of service
    for its cooldown. Otherwise each starts as its turn comes."""

    def __init__(
        self,
        configs: dict[str, dict[str, Any]],
        workdir: Path,
        *,
        together: bool,
        log_levels: Mapping[str, str] | None = None,
    ) -> None:
        """`log_levels`: a gateway's `--log-level` by label, if not "warning"."""
        self._configs = configs
        self._workdir = workdir
        self._together = together
        self._log_levels = log_levels or {}
        self._gateways: dict[str, BenchGateway] = {}

    def _start(self, label: str) -> BenchGateway:
        folder = self._workdir / label.replace(", ", "-").replace(" ", "-")
        level = self._log_levels.get(label, "warning")
        gateway = BenchGateway(self._configs[label], folder, log_level=level)
        self._gateways[label] = gateway
        return gateway

    def __enter__(self) -> GatewayTurns:
        if self._together:
            try:
                for label in self._configs:
                    self._start(label)
                for gateway in self._gateways.values():
                    gateway.wait_ready()
            except BaseException:
                stop_all(self._gateways.values())
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        stop_all(self._gateways.values())

    @contextmanager
    def turn(self, label: str) -> Iterator[BenchGateway]:
        """`label`'s gateway, ready; stopped on the way out."""
        gateway = self._gateways.get(label)
        if gateway is None:
            gateway = self._start(label)
            gateway.wait_ready()
        try:
            yield gateway
        finally:
            gateway.stop()


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
