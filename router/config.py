"""`router.yaml`: the gateway's configuration, validated at load by pydantic models.

A validation error names the offending field (as a dotted path) and the value it had, so an
operator can fix the file without reading code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from policies import Action, RulesError, RuleSet, load_rules, parse_rules
from router.parsers.registry import OUTPUT_PARSERS


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ConfigError(Exception):
    """router.yaml could not be loaded; the message names the field and value."""


class NodeConfig(_Strict):
    """One TileRT decode node: one slot."""

    host: str
    ctrl_port: Annotated[int, Field(ge=1, le=65535)] = 5556
    http_port: Annotated[int, Field(ge=1, le=65535)] = 5557
    name: str | None = None

    @property
    def id(self) -> str:
        return self.name or f"{self.host}:{self.http_port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"


class LatencyConfig(_Strict):
    """The latency path of one model: vLLM prefill servers and the TileRT node pool."""

    prefill: Annotated[list[str], Field(min_length=1)]
    nodes: Annotated[list[NodeConfig], Field(min_length=1)]
    max_seq_len: Annotated[int, Field(ge=2)] = 131072

    @field_validator("prefill")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        return [_check_url(u) for u in urls]

    @model_validator(mode="after")
    def _unique_nodes(self) -> LatencyConfig:
        ids = [n.id for n in self.nodes]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"node listed twice: {sorted(dup)}")
        return self


class ProxyConfig(_Strict):
    """Throughput via an existing native disaggregation proxy (PROTOCOLS.md §2.1)."""

    mode: Literal["proxy"]
    urls: Annotated[list[str], Field(min_length=1)]

    @field_validator("urls")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        return [_check_url(u) for u in urls]


class PullConfig(_Strict):
    """Throughput by orchestrating vLLM's NIXL pull legs (PROTOCOLS.md §2.2)."""

    mode: Literal["pull"]
    prefill: Annotated[list[str], Field(min_length=1)]
    decode: Annotated[list[str], Field(min_length=1)]

    @field_validator("prefill", "decode")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        return [_check_url(u) for u in urls]


class PrefillEngineConfig(_Strict):
    """A prefill instance as push-mode decode legs must name it (its NIXL side channel)."""

    url: str
    engine_id: str
    side_channel_host: str
    side_channel_port: Annotated[int, Field(ge=1, le=65535)]
    tp_size: Annotated[int, Field(ge=1)] = 1
    pp_size: Annotated[int, Field(ge=1)] = 1

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return _check_url(url)


class PushConfig(_Strict):
    """Throughput by orchestrating vLLM's NIXL push legs (PROTOCOLS.md §2.3)."""

    mode: Literal["push"]
    prefill: Annotated[list[PrefillEngineConfig], Field(min_length=1)]
    decode: Annotated[list[str], Field(min_length=1)]

    @field_validator("decode")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        return [_check_url(u) for u in urls]


ThroughputConfig = Annotated[ProxyConfig | PullConfig | PushConfig, Field(discriminator="mode")]


class RedisGateConfig(_Strict):
    """The shared gate state of `gate.backend: redis`: several gateway replicas, one pool."""

    url: str
    # A mounted secret holding the password; otherwise the URL's password, otherwise the
    # environment variable PDGW_REDIS_PASSWORD.
    password_file: str | None = None
    # Every key and channel starts with this: one prefix per deployment sharing a Redis.
    key_prefix: str = "pdgw"
    socket_timeout_s: Annotated[float, Field(gt=0)] = 1.0
    # A held node's lease lives this long unless renewed; it is renewed every renew_every_s.
    lease_ttl_s: Annotated[float, Field(gt=0)] = 10.0
    renew_every_s: Annotated[float, Field(gt=0)] = 3.0
    # Waiters wake on a published release; this bounded poll covers a lost message.
    poll_s: Annotated[float, Field(gt=0)] = 1.0

    @field_validator("url")
    @classmethod
    def _redis_url(cls, url: str) -> str:
        scheme, _, rest = url.partition("://")
        if scheme not in ("redis", "rediss") or not rest.split("/")[0].rpartition("@")[2]:
            raise ValueError(f"not a redis:// or rediss:// URL with a host: {url!r}")
        return url

    @field_validator("key_prefix")
    @classmethod
    def _prefix(cls, prefix: str) -> str:
        if not prefix or any(c.isspace() or c in "{}|" for c in prefix):
            raise ValueError("key_prefix must be non-empty, without spaces, braces or '|'")
        return prefix

    @model_validator(mode="after")
    def _renewal(self) -> RedisGateConfig:
        if self.renew_every_s * 2 > self.lease_ttl_s:
            raise ValueError(
                f"renew_every_s ({self.renew_every_s}) must be at most half of lease_ttl_s"
                f" ({self.lease_ttl_s}), so that one missed renewal does not lose a node"
            )
        return self


class GateConfig(_Strict):
    """How requests wait for a TileRT slot."""

    backend: Literal["memory", "redis"] = "memory"
    redis: RedisGateConfig | None = None
    max_queue: Annotated[int, Field(ge=0)] = 256
    max_queue_wait_ms: Annotated[int, Field(ge=0)] = 30_000
    # Node health: soft failures in a row that take a node out (hard ones do at once),
    # how long it stays out before probing, and how often out nodes are probed.
    failure_threshold: Annotated[int, Field(ge=1)] = 3
    node_cooldown_s: Annotated[float, Field(ge=0)] = 5.0
    probe_interval_s: Annotated[float, Field(gt=0)] = 1.0

    @model_validator(mode="after")
    def _backend_settings(self) -> GateConfig:
        if self.backend == "redis" and self.redis is None:
            raise ValueError("gate.redis (at least its url) is required with backend: redis")
        return self


class UpstreamsConfig(_Strict):
    """Connection pools, one per upstream server (each vLLM URL, each TileRT node)."""

    max_connections: Annotated[int, Field(ge=1)] = 1024
    max_keepalive_connections: Annotated[int, Field(ge=0)] = 256
    keepalive_expiry_s: Annotated[float, Field(gt=0)] = 30.0


class TimeoutsConfig(_Strict):
    connect_s: Annotated[float, Field(gt=0)] = 5.0
    prefill_s: Annotated[float, Field(gt=0)] = 600.0
    kv_transfer_s: Annotated[float, Field(gt=0)] = 120.0
    decode_stall_s: Annotated[float, Field(gt=0)] = 30.0
    cancel_s: Annotated[float, Field(gt=0)] = 5.0


class ModelConfig(_Strict):
    """One served model as clients see it."""

    name: str
    tokenizer: str
    output_parser: str = "none"
    latency: LatencyConfig | None = None
    throughput: ThroughputConfig | None = None

    @field_validator("output_parser")
    @classmethod
    def _parser(cls, name: str) -> str:
        if name not in OUTPUT_PARSERS:
            raise ValueError(f"unknown output parser {name!r}; one of {sorted(OUTPUT_PARSERS)}")
        return name

    @model_validator(mode="after")
    def _some_path(self) -> ModelConfig:
        if self.latency is None and self.throughput is None:
            raise ValueError(f"model {self.name!r} needs a latency or a throughput section")
        return self


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8000
    max_body_bytes: Annotated[int, Field(ge=1024)] = 32 * 1024 * 1024
    # After SIGTERM: how long in-flight requests may run before they are cut off.
    shutdown_grace_s: Annotated[float, Field(ge=0)] = 30.0


class ClassificationConfig(_Strict):
    """Where the rules come from (a file, or inline), and how API keys are named.

    With neither `rules_file` nor `rules`, every request for a model with a TileRT pool
    takes the latency path (and the capability guard still applies).
    """

    rules_file: str | None = None
    rules: Any = None
    api_key_name_header: str = "x-pd-api-key-name"

    @model_validator(mode="after")
    def _one_source(self) -> ClassificationConfig:
        if self.rules_file is not None and self.rules is not None:
            raise ValueError("give either rules_file or rules, not both")
        return self


class AdminConfig(_Strict):
    """`/admin/*` endpoints; with an api_key set they require `Authorization: Bearer <key>`."""

    api_key: str | None = None


class GatewayConfig(_Strict):
    server: ServerConfig = ServerConfig()
    admin: AdminConfig = AdminConfig()
    classification: ClassificationConfig = ClassificationConfig()
    gate: GateConfig = GateConfig()
    timeouts: TimeoutsConfig = TimeoutsConfig()
    upstreams: UpstreamsConfig = UpstreamsConfig()
    models: Annotated[list[ModelConfig], Field(min_length=1)]
    base_dir: Path = Path(".")

    @model_validator(mode="after")
    def _unique_models(self) -> GatewayConfig:
        names = [m.name for m in self.models]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"model listed twice: {sorted(dup)}")
        return self

    def model(self, name: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == name), None)


def _check_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an http(s) URL: {url!r}")
    return url.rstrip("/")


def parse_config(data: Any, *, base_dir: Path = Path(".")) -> GatewayConfig:
    """Validate an already-parsed router.yaml document, its rules included."""
    if not isinstance(data, dict):
        raise ConfigError("router.yaml: the top level must be a mapping")
    try:
        config = GatewayConfig.model_validate({**data, "base_dir": base_dir})
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None
    compile_rules(config)
    return config


def compile_rules(config: GatewayConfig) -> RuleSet:
    """The classification rules of `config`; ConfigError names the rule and field."""
    source = config.classification
    try:
        if source.rules_file is not None:
            path = Path(source.rules_file)
            return load_rules(path if path.is_absolute() else config.base_dir / path)
        if source.rules is not None:
            return parse_rules(source.rules, source="classification.rules")
    except RulesError as exc:
        raise ConfigError(f"router.yaml: classification: {exc}") from None
    return RuleSet(default=Action(name="default", path="latency"))


def load_config(path: str | Path) -> GatewayConfig:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_config(data, base_dir=path.resolve().parent)


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        value = err.get("input")
        shown = "" if isinstance(value, dict | list) else f" (got {value!r})"
        lines.append(f"{where}: {err['msg']}{shown}")
    return "router.yaml is invalid:\n  " + "\n  ".join(lines)
