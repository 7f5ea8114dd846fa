"""Which simulators a configuration needs: one `SimStack` per model, derived from its sections.

Each TileRT node becomes a simulated node; each distinct server URL one simulated vLLM
server whose role follows from every section that names it (a prefill URL shared by the
latency and throughput sections is one server; a proxy URL is a `both`-role server).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from router.config import GatewayConfig, ModelConfig, NodeConfig
from router.tokens.tokenizer import BUILTIN

if TYPE_CHECKING:
    from sim.stack import SimStack

DEFAULT_MAX_SEQ_LEN = 131072

# A model's `output_parser` -> the vLLM flags that make the throughput path's servers answer
# with the same message shape as the latency path (docs/output-formats.md); they also tell
# the simulated model whether it thinks.
VLLM_PARSER_FLAGS: dict[str, list[str]] = {
    "none": [],
    "glm47": ["--reasoning-parser", "glm45", "--tool-call-parser", "glm47"],
    "glm45": ["--reasoning-parser", "glm45", "--tool-call-parser", "glm45"],
    "deepseek_v32": ["--reasoning-parser", "deepseek_v3", "--tool-call-parser", "deepseek_v32"],
}


def parser_flags(output_parser: str) -> list[str]:
    """The `sim.vllm` (and vLLM) flags matching a model's `output_parser`."""
    flags = VLLM_PARSER_FLAGS.get(output_parser, [])
    return [*flags, "--enable-auto-tool-choice"] if "--tool-call-parser" in flags else flags


class DemoError(Exception):
    """The configuration cannot be simulated on this machine; the message says why."""


@dataclass(slots=True)
class SimServer:
    """One simulated vLLM server: every section of a model that names its URL shares it."""

    url: str
    roles: set[str] = field(default_factory=set)
    """`prefill`, `decode` and/or `both` (a proxy stand-in)."""
    engine_id: str | None = None
    side_channel_port: int | None = None
    tilert: str | None = None
    """The TileRT release of its connector (a latency pool's prefill server)."""
    throughput: bool = False
    """It serves the throughput path: it parses reasoning and tool calls as vLLM would."""

    @property
    def role(self) -> str:
        """The sim.vllm `--role`: its one role, or `both` when it plays several."""
        return next(iter(self.roles)) if len(self.roles) == 1 else "both"

    @property
    def port(self) -> int:
        return url_port(self.url)


@dataclass(slots=True)
class ModelPlan:
    """The simulators one model needs, all on one loopback host."""

    model: ModelConfig
    tokenizer: str
    """As the simulators' `--tokenizer` takes it: `deepseek` or an absolute path."""
    host: str = ""
    nodes: list[NodeConfig] = field(default_factory=list)
    servers: list[SimServer] = field(default_factory=list)

    @property
    def prefill_kind(self) -> list[SimServer]:
        """Servers started as the stack's `prefill-<i>` processes (prefill and both roles)."""
        return [s for s in self.servers if s.role != "decode"]

    @property
    def decode_kind(self) -> list[SimServer]:
        """Servers started as the stack's `decode-<i>` processes."""
        return [s for s in self.servers if s.role == "decode"]

    def server(self, url: str, role: str) -> SimServer:
        """The server at `url` (added at its first mention), now also playing `role`."""
        found = next((s for s in self.servers if s.url == url), None)
        if found is None:
            found = SimServer(url)
            self.servers.append(found)
        found.roles.add(role)
        return found

    def stack_args(self, *, pin_ports: bool) -> dict[str, list[str]]:
        """Per-process arguments: roles, engine ids and, when pinned, the configured ports."""
        args: dict[str, list[str]] = {}
        for i, node in enumerate(self.nodes):
            own = ["--protocol", node.tilert] if node.tilert is not None else []
            if pin_ports:
                own += ["--ctrl-port", str(node.ctrl_port), "--http-port", str(node.http_port)]
            if own:
                args[f"node-{i}"] = own
        parsing = parser_flags(self.model.output_parser)
        for i, server in enumerate(self.prefill_kind):
            own = ["--role", "both", "--engine-id", f"proxy-{i}"] if server.role == "both" else []
            # Every server, latency prefill included: whether the model thinks decides the
            # answer it plans, which a TileRT node continues.
            own += parsing
            if server.engine_id is not None:
                own += ["--engine-id", server.engine_id]
            if server.tilert is not None:
                own += ["--tilert-protocol", server.tilert]
            if pin_ports:
                own += ["--port", str(server.port)]
                if server.side_channel_port is not None:
                    own += ["--side-channel-port", str(server.side_channel_port)]
            args[f"prefill-{i}"] = own
        for i, server in enumerate(self.decode_kind):
            own = list(parsing) if server.throughput else []
            args[f"decode-{i}"] = [*own, "--port", str(server.port)] if pin_ports else own
        return args

    def stack(self, *, pin_ports: bool) -> SimStack:
        """The model's `SimStack` (not started): configured ports, or free ones; its
        simulators die with the demo, however the demo ends."""
        from router.process.lifeline import die_with_parent
        from sim.stack import SimStack

        latency = self.model.latency
        max_seq_len = latency.max_seq_len if latency is not None else DEFAULT_MAX_SEQ_LEN
        return SimStack(
            nodes=len(self.nodes),
            prefills=len(self.prefill_kind),
            decodes=len(self.decode_kind),
            tokenizer=self.tokenizer,
            model=self.model.name,
            host=self.host,
            node_args=["--max-seq-len", str(max_seq_len)],
            instance_args=self.stack_args(pin_ports=pin_ports),
            preexec_fn=die_with_parent(),
        )


def plan_stacks(config: GatewayConfig) -> list[ModelPlan]:
    """The simulators each model needs. DemoError for what cannot run on this machine."""
    owners: dict[str, str] = {}
    plans = []
    for model in config.models:
        plan = _plan_model(model, config.base_dir)
        for node in plan.nodes:
            _claim(owners, f"node {node.host}:{node.ctrl_port}/{node.http_port}", model.name)
        for server in plan.servers:
            _claim(owners, server.url, model.name)
        plan.host = _one_host(plan)
        plans.append(plan)
    return plans


def _plan_model(model: ModelConfig, base_dir: Path) -> ModelPlan:
    plan = ModelPlan(model, sim_tokenizer(model.tokenizer, base_dir))
    for pool in model.latency.pools if model.latency is not None else []:
        plan.nodes.extend(pool.nodes)
        for url in pool.prefill:
            plan.server(url, "prefill").tilert = pool.tilert
    throughput = model.throughput
    if throughput is None:
        return plan
    if throughput.mode == "proxy":
        for url in throughput.urls:
            plan.server(url, "both").throughput = True
        return plan
    if throughput.mode == "pull":
        for url in throughput.prefill:
            plan.server(url, "prefill").throughput = True
    else:
        for engine in throughput.prefill:
            check_loopback(engine.side_channel_host, f"model {model.name}: side_channel_host")
            server = plan.server(engine.url, "prefill")
            server.engine_id = engine.engine_id
            server.side_channel_port = engine.side_channel_port
            server.throughput = True
    for url in throughput.decode:
        plan.server(url, "decode").throughput = True
    return plan


def check_loopback(host: str, where: str) -> None:
    """DemoError unless `host` is this machine: simulators never run anywhere else."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise DemoError(
            f"{where}: {host!r} is not a loopback address; the demo starts simulators on this"
            " machine only (use 127.0.0.1). Run real backends with `pd-gateway serve`."
        )


def sim_tokenizer(spec: str, base_dir: Path) -> str:
    return spec if spec in BUILTIN else str(absolute(spec, base_dir))


def absolute(path: str, base_dir: Path) -> Path:
    """A configuration path as the gateway resolves it: relative to router.yaml's folder."""
    return Path(path) if Path(path).is_absolute() else (base_dir / path).resolve()


def url_port(url: str) -> int:
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def _claim(owners: dict[str, str], address: str, model: str) -> None:
    # A simulator serves one model name with one tokenizer: no sharing across models.
    first = owners.setdefault(address, model)
    if first != model:
        raise DemoError(
            f"{address} is configured for models {first!r} and {model!r}; the demo runs one"
            " set of simulators per model, so give each model its own servers and nodes"
        )


def _one_host(plan: ModelPlan) -> str:
    name = plan.model.name
    hosts = {node.host for node in plan.nodes}
    hosts |= {urlsplit(server.url).hostname or "" for server in plan.servers}
    for host in sorted(hosts):
        check_loopback(host, f"model {name}")
    if len(hosts) != 1:
        raise DemoError(
            f"model {name}: the demo runs a model's simulators on one host; got {sorted(hosts)}"
        )
    return hosts.pop()
