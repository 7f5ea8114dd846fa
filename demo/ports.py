"""Moves a configuration to where its simulators really listen.

The demo starts simulators on the configured ports, on ports moved by an offset, or on
free ports chosen by the OS; `rewrite` then gives the gateway a router.yaml naming the
actual addresses, with file paths made absolute so it loads from anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from demo.plan import DemoError, ModelPlan, absolute
from router.config import GatewayConfig
from router.tokens.tokenizer import BUILTIN

if TYPE_CHECKING:
    from sim.stack import SimStack

NodeKey = tuple[str, int, int]
"""A node as configured: (host, ctrl_port, http_port)."""


@dataclass(slots=True)
class Endpoints:
    """Where each configured backend listens: configured address -> actual ports."""

    urls: dict[str, str] = field(default_factory=dict)
    nodes: dict[NodeKey, tuple[int, int]] = field(default_factory=dict)
    """Configured node -> its actual (ctrl_port, http_port)."""
    side_channels: dict[str, int] = field(default_factory=dict)
    """Configured server URL -> its actual NIXL side-channel port."""

    def update(self, other: Endpoints) -> None:
        self.urls.update(other.urls)
        self.nodes.update(other.nodes)
        self.side_channels.update(other.side_channels)


def shifted(plans: list[ModelPlan], offset: int) -> Endpoints:
    """Every configured backend port moved by `offset` (to run beside another demo)."""
    endpoints = Endpoints()
    for plan in plans:
        for node in plan.nodes:
            moved = (shift(node.ctrl_port, offset), shift(node.http_port, offset))
            endpoints.nodes[(node.host, node.ctrl_port, node.http_port)] = moved
        for server in plan.servers:
            endpoints.urls[server.url] = with_port(server.url, shift(server.port, offset))
            if server.side_channel_port is not None:
                endpoints.side_channels[server.url] = shift(server.side_channel_port, offset)
    return endpoints


def started(plan: ModelPlan, stack: SimStack) -> Endpoints:
    """Where the simulators of `plan`, started as `stack`, actually listen."""
    endpoints = Endpoints()
    for node, info in zip(plan.nodes, stack.nodes, strict=True):
        key = (node.host, node.ctrl_port, node.http_port)
        endpoints.nodes[key] = (info.ctrl_port, info.http_port)
    servers = [*zip(plan.prefill_kind, stack.prefills, strict=True)]
    servers += zip(plan.decode_kind, stack.decodes, strict=True)
    for server, server_info in servers:
        endpoints.urls[server.url] = with_port(server.url, server_info.port)
        endpoints.side_channels[server.url] = server_info.side_channel_port
    return endpoints


def rewrite(config: GatewayConfig, endpoints: Endpoints, *, port: int) -> dict[str, Any]:
    """`config` as a router.yaml document: backends at `endpoints`, the gateway on `port`,
    and the tokenizer and rules file paths absolute."""
    doc = config.model_dump(mode="json", exclude={"base_dir"})
    doc["server"]["port"] = port
    classification = doc["classification"]
    if classification["rules_file"] is not None:
        classification["rules_file"] = str(absolute(classification["rules_file"], config.base_dir))
    for model in doc["models"]:
        if model["tokenizer"] not in BUILTIN:
            model["tokenizer"] = str(absolute(model["tokenizer"], config.base_dir))
        if model["generation_config"] is not None:
            model["generation_config"] = str(absolute(model["generation_config"], config.base_dir))
        for pool in model["latency"]["pools"] if model["latency"] is not None else ():
            pool["prefill"] = [endpoints.urls[url] for url in pool["prefill"]]
            for node in pool["nodes"]:
                key = (node["host"], node["ctrl_port"], node["http_port"])
                node["ctrl_port"], node["http_port"] = endpoints.nodes[key]
        if (throughput := model["throughput"]) is not None:
            _rewrite_throughput(throughput, endpoints)
    return doc


def _rewrite_throughput(section: dict[str, Any], endpoints: Endpoints) -> None:
    for key in ("urls", "decode"):
        if key in section:
            section[key] = [endpoints.urls[url] for url in section[key]]
    if section["mode"] == "pull":
        section["prefill"] = [endpoints.urls[url] for url in section["prefill"]]
    elif section["mode"] == "push":
        for engine in section["prefill"]:
            engine["side_channel_port"] = endpoints.side_channels[engine["url"]]
            engine["url"] = endpoints.urls[engine["url"]]


def with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return urlunsplit(parts._replace(netloc=f"{host}:{port}"))


def shift(port: int, offset: int) -> int:
    moved = port + offset
    if not 1 <= moved <= 65535:
        raise DemoError(f"port {port} moved by {offset} is {moved}, outside 1-65535")
    return moved
