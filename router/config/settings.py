"""`router.yaml`'s schema: strict, frozen pydantic models, one per section.

Models reject unknown fields and validate values where they are read; `loading` turns a
file into a `GatewayConfig` and names the offending field when one is wrong.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from router.parsers.registry import OUTPUT_PARSERS


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


TileRTVersion = Literal["0.1.5", "0.1.6"]
"""The TileRT release of a pool's nodes and of its prefill servers' connector: the two
speak incompatible control planes, so each pool holds one version (docs/protocols.md §1.6)."""


class NodeConfig(StrictModel):
    """One TileRT decode node: one slot."""

    host: str
    ctrl_port: Annotated[int, Field(ge=1, le=65535)] = 5556
    http_port: Annotated[int, Field(ge=1, le=65535)] = 5557
    name: str | None = None
    tilert: TileRTVersion | None = None
    """The TileRT release the node must run: its pool's (set from the pool)."""
    pool: str | None = None
    """The pool the node belongs to (set from the pool)."""

    @property
    def id(self) -> str:
        """The node's name in the pool (as the running gateway's `Node.id`)."""
        return self.name or f"{self.host}:{self.http_port}"


class DiscoveryConfig(StrictModel):
    """TileRT nodes found by resolving a DNS name (e.g. the headless Service of the nodes'
    StatefulSet): every address is a node with these ports. Looked up every `interval_s`;
    an address that appears joins the pool at once, one that disappears finishes its
    request and leaves; a failed lookup changes nothing."""

    dns: Annotated[str, Field(min_length=1)]
    ctrl_port: Annotated[int, Field(ge=1, le=65535)] = 5556
    http_port: Annotated[int, Field(ge=1, le=65535)] = 5557
    interval_s: Annotated[float, Field(gt=0)] = 10.0
    family: Literal["ipv4", "ipv6", "any"] = "any"


class KvEventsConfig(StrictModel):
    """Where each vLLM server publishes its KV-cache events (its `--kv-events-config`)."""

    port: Annotated[int, Field(ge=1, le=65535)] = 5557
    """A server's events are read from `tcp://<host of its URL>:<port>` ..."""
    topic: str = ""
    """... under this topic (vLLM's `topic`) ..."""
    endpoints: dict[str, Annotated[str, Field(pattern=r"^(tcp|ipc)://.+")]] = {}
    """... unless its URL is named here: server URL -> ZMQ endpoint."""

    @field_validator("endpoints")
    @classmethod
    def _urls(cls, endpoints: dict[str, str]) -> dict[str, str]:
        return {_check_url(url): endpoint for url, endpoint in endpoints.items()}


class SelectionWeights(StrictModel):
    """Each scorer's weight in a server's total (docs/upstreams.md); 0 leaves it out."""

    load: Annotated[float, Field(ge=0, le=100)] = 1.0
    """The work the gateway has in flight on the server."""
    queue: Annotated[float, Field(ge=0, le=100)] = 1.0
    """The server's own queue and KV-cache use, from its `/metrics`."""
    prefix: Annotated[float, Field(ge=0, le=100)] = 2.0
    """The share of the prompt the server holds in its prefix cache (worth this turn's
    saving and the next turn's: a conversation that moves leaves its cache behind)."""
    session: Annotated[float, Field(ge=0, le=100)] = 0.5
    """The session's preferred server."""
    random: Annotated[float, Field(ge=0, le=100)] = 0.0
    """A random score in [0, 1): alone (the others 0), a uniformly random choice."""


class SelectionConfig(StrictModel):
    """How a model's servers are chosen beyond health (docs/upstreams.md). Under a model it
    applies to every path; under `latency` or `throughput` it changes the fields it names
    for that path."""

    prefix_affinity: bool = True
    """Send a prompt to the server whose KV cache likely holds its longest prefix; costs
    encoding each prompt with the model's tokenizer."""
    prefix_index: Literal["sent", "kv_events"] = "sent"
    """How the gateway knows what each server holds: `sent`, the prompts sent to it
    recently; `kv_events`, what its KV-cache events say (vLLM's `--kv-events-config`),
    falling back to `sent` while its events are not flowing."""
    kv_events: KvEventsConfig = KvEventsConfig()
    block_size: Annotated[int, Field(ge=1, le=4096)] = 16
    """Tokens per KV block, as the prefill servers' `--block-size` (vLLM's default: 16)."""
    session_header: Annotated[
        str, Field(min_length=1, pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
    ] = "x-session-id"
    """A request header naming the conversation; without it the request's `user` field.
    A session's requests prefer one stable server when no prefix decides."""
    weights: SelectionWeights = SelectionWeights()

    def overridden_by(self, override: SelectionConfig | None) -> SelectionConfig:
        """This selection with the fields `override` names replaced (weights field by
        field)."""
        if override is None:
            return self
        update = {name: getattr(override, name) for name in override.model_fields_set}
        if "weights" in update:
            named = override.weights.model_fields_set
            update["weights"] = self.weights.model_copy(
                update={name: getattr(override.weights, name) for name in named}
            )
        return self.model_copy(update=update)


class LatencyPoolConfig(StrictModel):
    """TileRT decode nodes and the vLLM prefill servers that push KV state to them: a
    request's prefill is always sent to a prefill server of its node's pool."""

    name: str = "default"
    tilert: TileRTVersion = "0.1.6"
    prefill: Annotated[list[str], Field(min_length=1)]
    nodes: list[NodeConfig] = []
    discover: DiscoveryConfig | None = None
    """Nodes found by DNS (a headless Service's records), beside the listed `nodes`."""

    @field_validator("prefill")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        return [_check_url(u) for u in urls]

    @model_validator(mode="after")
    def _nodes_of_this_pool(self) -> LatencyPoolConfig:
        if not self.nodes and self.discover is None:
            raise ValueError(f"pool {self.name!r} needs `nodes`, `discover` or both")
        for node in self.nodes:
            if node.tilert not in (None, self.tilert):
                raise ValueError(
                    f"node {node.id} says TileRT {node.tilert} in a pool of TileRT {self.tilert}"
                )
        object.__setattr__(self, "nodes", [self.member(n) for n in self.nodes])
        return self

    def member(self, node: NodeConfig) -> NodeConfig:
        """`node` as one of this pool's: its release and its pool named."""
        return node.model_copy(update={"tilert": self.tilert, "pool": self.name})


class LatencyConfig(StrictModel):
    """The latency path of one model: pools of TileRT nodes, each with its prefill servers.

    One pool may be written inline (`prefill`, `nodes` and optionally `tilert` directly
    under `latency`); several (a 0.1.5 and a 0.1.6 pool during an upgrade) under `pools`.
    """

    pools: Annotated[list[LatencyPoolConfig], Field(min_length=1)]
    max_seq_len: Annotated[int, Field(ge=2)] = 131072
    selection: SelectionConfig | None = None
    """The model's `selection`, changed for the latency path's prefill choice."""
    prefill_input: Literal["text", "token_ids"] = "text"
    """How a chat prompt reaches the prefill: `text` (vLLM renders and tokenizes it) or
    `token_ids` (the gateway's own rendering and encoding, once each prefill server's
    `/tokenize` has shown it identical; needs the model's chat template)."""
    continuations: Annotated[int, Field(ge=0, le=8)] = 1
    """How many times one answer whose node failed mid-stream is continued on another
    node of the pool (0: never; the answer then ends with an error event)."""
    continuation_wait_ms: Annotated[int, Field(ge=0, le=60_000)] = 2000
    """How long a continuation waits for a free node before the answer ends in error."""

    @model_validator(mode="before")
    @classmethod
    def _inline_pool(cls, data: Any) -> Any:
        inline = ("name", "tilert", "prefill", "nodes", "discover")
        if isinstance(data, dict) and any(key in data for key in inline):
            if "pools" in data:
                raise ValueError("give either `pools` or one inline pool (prefill, nodes)")
            pool = {key: data[key] for key in inline if key in data}
            data = {k: v for k, v in data.items() if k not in inline} | {"pools": [pool]}
        return data

    @model_validator(mode="after")
    def _consistent_pools(self) -> LatencyConfig:
        ids = [n.id for n in self.nodes]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"node listed twice: {sorted(dup)}")
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names must be unique: {names}")
        versions: dict[str, str] = {}
        for pool in self.pools:
            for url in pool.prefill:
                if versions.setdefault(url, pool.tilert) != pool.tilert:
                    raise ValueError(
                        f"prefill server {url} is in pools of TileRT {versions[url]} and "
                        f"{pool.tilert}: a prefill server's connector speaks one version"
                    )
        return self

    @property
    def nodes(self) -> list[NodeConfig]:
        """Every node of every pool."""
        return [node for pool in self.pools for node in pool.nodes]

    @property
    def prefill(self) -> list[str]:
        """Every prefill server of every pool, each once."""
        return list(dict.fromkeys(url for pool in self.pools for url in pool.prefill))

    @property
    def discovers(self) -> bool:
        return any(pool.discover is not None for pool in self.pools)


class ProxyConfig(StrictModel):
    """Throughput via an existing native disaggregation proxy (docs/protocols.md §2.1)."""

    mode: Literal["proxy"]
    urls: Annotated[list[str], Field(min_length=1)]
    selection: SelectionConfig | None = None
    """The model's `selection`, changed for the native path."""

    @field_validator("urls")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        return [_check_url(u) for u in urls]


class ConditionalConfig(StrictModel):
    """Conditional disaggregation: `pull` and `push` serve a request whole on the decode
    server chosen for it (prefill included) when splitting it would not pay."""

    min_uncached_tokens: Annotated[int, Field(ge=0)] = 0
    """Split only when more of the prompt than this is not cached at that decode server
    (from the prefix index: `selection.prefix_affinity`); 0: only a prompt it holds whole
    is served whole for this reason."""
    prefill_busier_by: Annotated[int, Field(ge=1)] | None = None
    """Serve whole when even the least busy prefill server has this many more requests in
    flight than that decode server; none: never for this reason."""


class PullConfig(StrictModel):
    """Throughput by orchestrating vLLM's NIXL pull legs (docs/protocols.md §2.2)."""

    mode: Literal["pull"]
    prefill: Annotated[list[str], Field(min_length=1)]
    decode: Annotated[list[str], Field(min_length=1)]
    selection: SelectionConfig | None = None
    """The model's `selection`, changed for the native path."""
    conditional: ConditionalConfig | None = None
    """When a request is served whole instead of split; none: always split."""
    continuations: Annotated[int, Field(ge=0, le=8)] = 1
    """Times a streamed answer whose decode server fails mid-stream goes on on another
    decode server (the prompt and the output so far as token ids); 0: the stream ends with
    an error event, and its chunks' ids are not asked for."""

    @field_validator("prefill", "decode")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        return [_check_url(u) for u in urls]


class PrefillEngineConfig(StrictModel):
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


class PushConfig(StrictModel):
    """Throughput by orchestrating vLLM's NIXL push legs (docs/protocols.md §2.3)."""

    mode: Literal["push"]
    prefill: Annotated[list[PrefillEngineConfig], Field(min_length=1)]
    decode: Annotated[list[str], Field(min_length=1)]
    selection: SelectionConfig | None = None
    """The model's `selection`, changed for the native path."""
    conditional: ConditionalConfig | None = None
    """When a request is served whole instead of split; none: always split."""
    continuations: Annotated[int, Field(ge=0, le=8)] = 1
    """Times a streamed answer whose decode server fails mid-stream goes on on another
    decode server (the prompt and the output so far as token ids); 0: the stream ends with
    an error event, and its chunks' ids are not asked for."""

    @field_validator("decode")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        return [_check_url(u) for u in urls]


ThroughputConfig = Annotated[ProxyConfig | PullConfig | PushConfig, Field(discriminator="mode")]


RedisDeployment = Literal["single", "cluster", "sentinel"]
_REDIS_SCHEMES: dict[str, tuple[RedisDeployment, bool]] = {
    "redis": ("single", False),
    "rediss": ("single", True),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
}
_DEFAULT_PORTS: dict[RedisDeployment, int] = {"single": 6379, "cluster": 6379, "sentinel": 26379}


class RedisAddress(BaseModel):
    """Where the gate's Redis is, as `gate.redis.url` says: one server (`redis://`), a
    Redis Cluster (`redis+cluster://node:port,node:port`: any of its nodes, to learn the
    others from) or a master found through Sentinel (`redis+sentinel://sentinel:port,
    sentinel:port/<master name>[/<db>]`). An `s` after `redis` is TLS."""

    model_config = ConfigDict(frozen=True)

    deployment: RedisDeployment
    tls: bool
    hosts: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    db: int
    master: str | None  # Sentinel's name for the master

    @classmethod
    def parse(cls, url: str) -> RedisAddress:
        """ValueError naming what is wrong."""
        scheme, sep, rest = url.partition("://")
        if not sep or scheme not in _REDIS_SCHEMES:
            raise ValueError(f"not a URL of one of the schemes {', '.join(_REDIS_SCHEMES)}")
        deployment, tls = _REDIS_SCHEMES[scheme]
        location, _, path = rest.partition("/")
        userinfo, _, hostlist = location.rpartition("@")
        username, _, password = userinfo.partition(":")
        hosts = tuple(_host_port(h, _DEFAULT_PORTS[deployment]) for h in hostlist.split(","))
        if deployment == "single" and len(hosts) > 1:
            raise ValueError("one host for redis:// (several are redis+cluster:// or +sentinel)")
        parts = [p for p in path.split("?")[0].split("/") if p]
        master = None
        if deployment == "sentinel":
            if not parts:
                raise ValueError("redis+sentinel:// needs the master's name: .../<master name>")
            master, parts = parts[0], parts[1:]
        if len(parts) > 1 or (parts and not parts[0].isdigit()):
            raise ValueError(f"{path!r} is not a database number")
        db = int(parts[0]) if parts else 0
        if deployment == "cluster" and db != 0:
            raise ValueError("a Redis Cluster has database 0 only")
        return cls(
            deployment=deployment,
            tls=tls,
            hosts=hosts,
            username=unquote(username) or None,
            password=unquote(password) or None,
            db=db,
            master=master,
        )


def _host_port(text: str, default_port: int) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6]:port
        host, _, port = text[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = text.rpartition(":") if ":" in text else (text, "", "")
    if not host:
        raise ValueError(f"no host in {text!r}")
    if port and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"{port!r} is not a port (in {text!r})")
    return host, int(port) if port else default_port


class RedisGateConfig(StrictModel):
    """The shared gate state of `gate.backend: redis`: several gateway replicas, one pool."""

    # redis:// or rediss:// (one server), redis+cluster:// (a Redis Cluster: any nodes of
    # it, comma-separated) or redis+sentinel://sentinel:26379,.../<master name> (Sentinel).
    url: str
    # The password, one way at most: a mounted secret (`password_file`, an absolute path),
    # the URL's own (redis://:PASSWORD@host), or `password`, best given in the environment
    # as PDGW_GATE__REDIS__PASSWORD (or PDGW_GATE__REDIS__PASSWORD_FILE). With Sentinel it
    # is the master's; the sentinels are asked without one.
    password_file: str | None = None
    password: str | None = None
    # Every key and channel starts with this: one prefix per deployment sharing a Redis.
    key_prefix: str = "pdgw"
    socket_timeout_s: Annotated[float, Field(gt=0)] = 1.0
    # A held node's lease lives this long unless renewed; it is renewed every renew_every_s.
    lease_ttl_s: Annotated[float, Field(gt=0)] = 10.0
    renew_every_s: Annotated[float, Field(gt=0)] = 3.0
    # Waiters wake on a published release; this bounded poll covers a lost message.
    poll_s: Annotated[float, Field(gt=0)] = 1.0

    @property
    def address(self) -> RedisAddress:
        return RedisAddress.parse(self.url)

    @property
    def claim_window_s(self) -> float:
        """How long a queued waiter has to claim a node granted to it: time to miss the
        wake-up, poll and be answered, with a poll to spare. At most half a lease's TTL, so
        that the grant's lease is still there to free when the window has passed. A grant
        left unclaimed that long goes to the next waiter (docs/redis.md)."""
        return min(self.lease_ttl_s / 2, 2 * self.poll_s + self.socket_timeout_s)

    @property
    def url_has_password(self) -> bool:
        return self.address.password is not None

    @field_validator("url")
    @classmethod
    def _redis_url(cls, url: str) -> str:
        RedisAddress.parse(url)
        return url

    @field_validator("key_prefix")
    @classmethod
    def _prefix(cls, prefix: str) -> str:
        if not prefix or any(c.isspace() or c in "{}|" for c in prefix):
            raise ValueError("key_prefix must be non-empty, without spaces, braces or '|'")
        return prefix

    @model_validator(mode="after")
    def _settings(self) -> RedisGateConfig:
        ways = [
            ("password_file", self.password_file is not None),
            ("the url's password", self.url_has_password),
            ("password", self.password is not None),
        ]
        if sum(given for _, given in ways) > 1:
            given = " and ".join(name for name, set_ in ways if set_)
            raise ValueError(f"give the Redis password one way only, not {given}")
        if self.renew_every_s * 2 > self.lease_ttl_s:
            raise ValueError(
                f"renew_every_s ({self.renew_every_s}) must be at most half of lease_ttl_s"
                f" ({self.lease_ttl_s}), so that one missed renewal does not lose a node"
            )
        return self


class GateConfig(StrictModel):
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
    # How often every node is asked for its TileRT release and features (/capabilities).
    capabilities_interval_s: Annotated[float, Field(gt=0)] = 30.0

    @model_validator(mode="after")
    def _backend_settings(self) -> GateConfig:
        if self.backend == "redis" and self.redis is None:
            raise ValueError("gate.redis (at least its url) is required with backend: redis")
        return self


class LimitsConfig(StrictModel):
    """What one request may carry, checked before any work; an excess is a 400 naming it."""

    # orjson re-encodes at most 254 levels: the ceiling keeps every accepted body sendable.
    max_json_depth: Annotated[int, Field(ge=8, le=200)] = 64
    max_messages: Annotated[int, Field(ge=1)] = 4096
    max_tools: Annotated[int, Field(ge=0)] = 256
    max_prompts: Annotated[int, Field(ge=1)] = 256
    max_stop_strings: Annotated[int, Field(ge=0)] = 32
    max_stop_chars: Annotated[int, Field(ge=1)] = 512


class UpstreamCredential(StrictModel):
    """The API key a backend expects (vLLM's `--api-key`), sent as `Authorization: Bearer`
    on every call to `url`; never the client's own."""

    url: str
    api_key_env: str | None = None
    api_key_file: str | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return _check_url(url)

    @model_validator(mode="after")
    def _one_source(self) -> UpstreamCredential:
        _exactly_one(self.url, api_key_env=self.api_key_env, api_key_file=self.api_key_file)
        return self


class UpstreamsConfig(StrictModel):
    """Connection pools, one per upstream base URL (each vLLM URL, each TileRT node), and
    what an upstream's answer may hold."""

    credentials: list[UpstreamCredential] = []

    max_connections: Annotated[int, Field(ge=1)] = 1024
    max_keepalive_connections: Annotated[int, Field(ge=0)] = 256
    # Below the upstream server's own idle timeout (vLLM and uvicorn close idle connections
    # after 5 s), so the pool never sends a request down a connection its server is closing.
    keepalive_expiry_s: Annotated[float, Field(gt=0)] = 4.0
    max_header_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024
    """An answer's status line and headers (vLLM's are a few hundred bytes)."""
    max_header_count: Annotated[int, Field(ge=16)] = 256
    """An answer's header fields (vLLM sends a handful)."""
    # A whole non-streamed answer: n choices of a long generation with top logprobs run to
    # megabytes; a streamed body is relayed as it comes and not capped.
    max_body_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024 * 1024
    probe_interval_s: Annotated[float, Field(ge=0)] = 5.0
    """How often each vLLM server (and proxy) is asked `GET /health`: a server that fails
    counts it as a failed call, an ejected one that answers is let back early; 0: never."""
    load_interval_s: Annotated[float, Field(ge=0)] = 2.0
    """How often each vLLM server (and proxy) is asked `GET /metrics` for its requests
    running and waiting and its KV-cache use, to rank it by; 0: never (ranked by the
    gateway's own requests in flight alone)."""


class TimeoutsConfig(StrictModel):
    connect_s: Annotated[float, Field(gt=0)] = 5.0
    prefill_s: Annotated[float, Field(gt=0)] = 600.0
    kv_transfer_s: Annotated[float, Field(gt=0)] = 120.0
    kv_admission_s: Annotated[float, Field(gt=0)] = 10.0
    decode_stall_s: Annotated[float, Field(gt=0)] = 30.0
    cancel_s: Annotated[float, Field(gt=0)] = 5.0


class ObjectivesConfig(StrictModel):
    """What the predictor of rules' objectives assumes of the model's servers and nodes
    until it has measured them, and how much history it weighs (docs/rules.md#objectives)."""

    prefill_ms_per_token: Annotated[float, Field(ge=0, le=1000)] = 0.1
    """Prefill time per prompt token a server has to compute (not already cached)."""
    prefill_base_ms: Annotated[float, Field(ge=0, le=60_000)] = 20.0
    """Prefill time of an empty prompt: the call's own cost."""
    itl_ms: Annotated[float, Field(gt=0, le=60_000)] = 20.0
    """A vLLM decode server's gap between tokens with one request running."""
    itl_ms_per_running: Annotated[float, Field(ge=0, le=60_000)] = 1.0
    """What each further running request adds to that gap."""
    tilert_itl_ms: Annotated[float, Field(gt=0, le=60_000)] = 5.0
    """A TileRT node's gap between tokens."""
    handoff_ms: Annotated[float, Field(ge=0, le=60_000)] = 20.0
    """From a prefill's end to the first token from the decode side (the KV transfer and
    the first decode step)."""
    memory: Annotated[int, Field(ge=4, le=10_000)] = 50
    """How many recent observations a learned figure mostly rests on (older ones fade)."""
    margin: Annotated[float, Field(ge=0, le=1)] = 0.15
    """A way meets an objective when its prediction, this share higher, does: room for what
    a prediction cannot see (requests that join a server during the answer)."""


class SizingConfig(StrictModel):
    """What the recommended pool sizes aim at (docs/operations.md#sizing-the-pools): the
    `pd_gateway_sizing_*` metrics that the autoscaling objects read."""

    window_s: Annotated[float, Field(ge=10, le=3600)] = 120.0
    """The figures are averages over about this many recent seconds: shorter follows a
    change sooner, longer recommends less nervously."""
    tilert_wait_ms: Annotated[float, Field(gt=0, le=600_000)] = 500.0
    tilert_wait_share: Annotated[float, Field(gt=0, lt=1)] = 0.05
    """Enough TileRT nodes that at most this share of requests waits longer than
    `tilert_wait_ms` for one."""
    prefill_utilization: Annotated[float, Field(gt=0, le=1)] = 0.8
    """Enough prefill servers that each is busy at most this share of the time."""
    decode_itl_ms: Annotated[float, Field(gt=0, le=60_000)] = 50.0
    """Enough native decode servers that none runs more requests than keeps its gap between
    tokens within this (as its measured gap line says)."""


class ModelConfig(StrictModel):
    """One served model as clients see it."""

    name: str
    tokenizer: str
    output_parser: str = "none"
    generation_config: str | None = None
    """The model's generation_config.json (or its directory): sampling defaults for what a
    latency request leaves unset, as vLLM applies them (else vLLM's own defaults)."""
    latency: LatencyConfig | None = None
    throughput: ThroughputConfig | None = None
    selection: SelectionConfig = SelectionConfig()
    objectives: ObjectivesConfig = ObjectivesConfig()
    """For rules with an objective: the predictor's assumptions until it has measured."""
    sizing: SizingConfig = SizingConfig()

    def selection_of(self, path: Literal["latency", "throughput"]) -> SelectionConfig:
        """The selection for one path: the model's, changed by the path's own."""
        section = self.latency if path == "latency" else self.throughput
        return self.selection.overridden_by(section.selection if section else None)

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


class ServerConfig(StrictModel):
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8000
    max_body_bytes: Annotated[int, Field(ge=1024)] = 32 * 1024 * 1024
    # After SIGTERM: how long in-flight requests may run before they are cut off.
    shutdown_grace_s: Annotated[float, Field(ge=0)] = 30.0
    keep_alive_s: Annotated[int, Field(ge=1)] = 75
    """How long an idle client connection stays open: longer than the idle timeout of the
    load balancer in front (60 s for most), or it may reuse a connection just closed."""
    first_request_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    """How long a new client connection may stay silent before its first request."""
    head_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    """From a request's first byte to its last header; later, 408 and the connection closed."""
    body_timeout_s: Annotated[float, Field(gt=0)] = 300.0
    """From a request's headers to the last byte of its body; later, 408 and closed. Only
    reading the request is timed: an answer (a long stream) is never cut."""
    max_connections: Annotated[int, Field(ge=1)] = 4096
    """Open client connections per process. Beyond it, a new connection is answered 503
    (`/health`, `/ready` and `/metrics` still answered) and closed; lowered to fit the
    open-file limit (raised to its hard limit at start)."""
    workers: Annotated[int, Field(ge=1, le=64)] = 1
    """Gateway processes on the one listening socket, an event loop (a core) each. More
    than one needs `gate.backend: redis`, where the pool's state is shared."""
    operator_port: Annotated[int, Field(ge=0, le=65535)] | None = None
    """A second port for the operator's endpoints: `/metrics` and `/admin/...` are served
    there and no longer on `port` (404), which serves the API; `/health` and `/ready` are
    on both. A NetworkPolicy can then keep this port to the monitoring and operator
    namespaces. Unset: everything on `port`."""
    expose_upstream: bool = False
    """Add `x-pd-upstream: <url>; reason=<why>` to each answer: the vLLM server (or proxy)
    chosen and why. Off by default: it shows clients the backends' addresses."""

    @model_validator(mode="after")
    def _ports_apart(self) -> ServerConfig:
        if self.operator_port is not None and self.operator_port == self.port != 0:
            raise ValueError(
                f"operator_port is port ({self.port}): the operator's endpoints need a port "
                "of their own (or leave operator_port out to serve everything on port)"
            )
        return self


class ClassificationConfig(StrictModel):
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


TenantSource = Literal["api_key", "header", "user"]
TENANT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,63}$"


NodeCount = Annotated[int, Field(ge=1, le=100_000)]


class TenantConfig(StrictModel):
    """A tenant's share of the TileRT pools, and its limits (none: no limit of that kind)."""

    weight: Annotated[float, Field(gt=0, le=1000)] = 1.0
    """Its part of a pool's node time against the other tenants waiting at one priority:
    a tenant of weight 2 is served as if it had held half the node time it held."""
    max_nodes: NodeCount | dict[str, NodeCount] | None = None
    """The TileRT nodes its requests may hold at once: in each model's pool alike, or per
    model (a model not named: no cap)."""
    requests_per_minute: Annotated[int, Field(ge=1, le=1_000_000_000)] | None = None
    tokens_per_minute: Annotated[int, Field(ge=1, le=1_000_000_000_000)] | None = None
    """The prompt's tokens and `max_tokens`, taken when the request is admitted, settled
    with the usage its answer reports."""
    node_seconds_per_hour: Annotated[float, Field(gt=0, le=1_000_000_000)] | None = None
    """A quota on TileRT node time: the time its answers held nodes, charged as each ends;
    once an hour's worth is spent, requests that would hold a node are refused (429
    `insufficient_quota`) until enough of it has come back."""

    def max_nodes_in(self, model: str) -> int | None:
        if isinstance(self.max_nodes, dict):
            return self.max_nodes.get(model)
        return self.max_nodes


class TenantsConfig(StrictModel):
    """Who a request is from, and what each tenant may use (docs/tenants.md)."""

    identify: list[TenantSource] = ["api_key"]
    """Where the tenant's name is taken from, the first that names one: the client's
    verified API key name, the `header` (trusted: set it only where a proxy in front sets
    it), the body's `user`. A request naming none is the `default` tenant."""
    header: str | None = None
    every: TenantConfig = TenantConfig()
    """Each tenant's share and limits alike (each counted per tenant)."""
    named: dict[Annotated[str, Field(pattern=TENANT_NAME)], TenantConfig] = {}
    """A named tenant's share and limits, replacing `every`'s where they are set."""
    fair_share: bool = True
    """The TileRT queue serves the tenants waiting at one priority by their weighted share of
    node time, and keeps each within its `max_nodes`; false: tenants do not change the
    queue's order (priority, deadline, arrival) and `weight` and `max_nodes` are unused."""
    on_store_unavailable: Literal["allow", "refuse"] = "allow"
    """While the limits' shared store (the gate's Redis) cannot be reached: let requests
    through uncounted, or refuse them (503)."""
    max_tracked: Annotated[int, Field(ge=1, le=10_000_000)] = 10_000
    """Tenants whose counts one process keeps at once (the least recently seen are
    forgotten beyond it: a client inventing names costs bounded memory)."""

    @model_validator(mode="after")
    def _header_named(self) -> TenantsConfig:
        if "header" in self.identify and self.header is None:
            raise ValueError("identify names header: give the header's name in header")
        if self.header is not None and not re.match(r"^[a-z0-9-]{1,64}$", self.header.lower()):
            raise ValueError(f"header: {self.header!r} is not a header name")
        if len(set(self.identify)) != len(self.identify):
            raise ValueError("identify: each source once")
        return self

    def tenant(self, tenant: str) -> TenantConfig:
        """`every`'s settings, with those the tenant's own entry sets in their place."""
        own = self.named.get(tenant)
        if own is None:
            return self.every
        return self.every.model_copy(update=own.model_dump(exclude_unset=True))


class LoggingConfig(StrictModel):
    """Log lines on stderr; `serve --log-level` overrides `level`."""

    level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    format: Literal["text", "json"] = "text"
    access_log: bool = True
    """One line per API request: id, model, path, rule, node, waits, tokens, status."""


EMPTY_KEY_SHA256 = hashlib.sha256(b"").hexdigest()


class ApiKeyConfig(StrictModel):
    """One client API key, known by `name` (what rules match as `api_key_name`): the key's
    SHA-256 in hex, or the key itself from an environment variable or a file."""

    name: Annotated[str, Field(min_length=1)]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    key_env: Annotated[str, Field(min_length=1)] | None = None
    key_file: Annotated[str, Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ApiKeyConfig:
        _exactly_one(
            f"key {self.name!r}", sha256=self.sha256, key_env=self.key_env, key_file=self.key_file
        )
        if self.sha256 == EMPTY_KEY_SHA256:
            raise ValueError(
                f"key {self.name!r}: sha256 is the digest of an empty key, which would let"
                " anyone in"
            )
        return self


class AuthConfig(StrictModel):
    """Client authentication. With `api_keys`, every API request needs
    `Authorization: Bearer <key>` and its key's name is what rules see as `api_key_name`."""

    api_keys: list[ApiKeyConfig] = []
    trust_key_name_header: bool = False
    """Without api_keys: take `classification.api_key_name_header` from the request even
    when listening beyond loopback (an authenticating proxy in front sets it)."""


class AdminConfig(StrictModel):
    """`/admin/*` endpoints; with a key they require `Authorization: Bearer <key>`. The key
    is given as `api_key`, or better through `api_key_env` or `api_key_file`."""

    api_key: str | None = None
    api_key_env: Annotated[str, Field(min_length=1)] | None = None
    api_key_file: Annotated[str, Field(min_length=1)] | None = None

    @field_validator("api_key")
    @classmethod
    def _not_empty(cls, key: str | None) -> str | None:
        if key is not None and not key.strip():
            raise ValueError(
                "an empty key would let anyone in: give a key, or leave api_key out (then"
                " /admin/* is open, and only on a loopback host)"
            )
        return key


class GatewayConfig(StrictModel):
    server: ServerConfig = ServerConfig()
    admin: AdminConfig = AdminConfig()
    auth: AuthConfig = AuthConfig()
    classification: ClassificationConfig = ClassificationConfig()
    tenants: TenantsConfig = TenantsConfig()
    gate: GateConfig = GateConfig()
    timeouts: TimeoutsConfig = TimeoutsConfig()
    upstreams: UpstreamsConfig = UpstreamsConfig()
    limits: LimitsConfig = LimitsConfig()
    logging: LoggingConfig = LoggingConfig()
    models: Annotated[list[ModelConfig], Field(min_length=1)]
    base_dir: Path = Path(".")
    source: str = "router.yaml"
    """The file it came from, for messages."""

    @model_validator(mode="after")
    def _unique_models(self) -> GatewayConfig:
        names = [m.name for m in self.models]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"model listed twice: {sorted(dup)}")
        if self.gate.backend == "memory" and self.server.workers > 1:
            raise ValueError(
                f"server.workers is {self.server.workers}, but gate.backend memory keeps the"
                " TileRT pool in one process: several would double-book its nodes (use"
                " gate.backend redis)"
            )
        if self.gate.backend == "memory":
            # Each model's pool gates its nodes in memory: a node in two would serve both.
            nodes = [n.id for m in self.models if m.latency for n in m.latency.nodes]
            if shared := sorted({n for n in nodes if nodes.count(n) > 1}):
                raise ValueError(
                    f"node in the latency pools of two models: {shared} (with gate.backend"
                    " memory a node belongs to one model; the redis backend shares it)"
                )
        return self

    def model(self, name: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == name), None)


def _exactly_one(what: str, **sources: str | None) -> None:
    if sum(v is not None for v in sources.values()) != 1:
        raise ValueError(f"{what}: give exactly one of {', '.join(sources)}")


def _check_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an http(s) URL: {url!r}")
    return url.rstrip("/")
