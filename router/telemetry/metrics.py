"""Prometheus metrics, declared once: typed recorders for the call sites, and gauges read
from the pools at scrape time (so the hot path never updates them).

Names are layered `pd_gateway_<area>_<what>`; label values come from bounded sets (model
and rule names from the configuration, paths, status codes, error codes).

Every metric of the gateway is declared here. The gate's lease metrics (`GateMetrics`,
the gate's `GateEvents`) are handed to the gate backends when a pool is built
(`Metrics.gate`); the KV-event indexes are read at scrape time like the pools.
"""

from __future__ import annotations

import os
import platform
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import (
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from router import __version__
from router.gate import GateSnapshot
from router.selection import ServerSet, load_snapshot
from router.selection.kv_events import STATES as KV_EVENTS_STATES
from router.selection.kv_events import ServerBlocks
from router.telemetry.access import AccessRecord

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""Where worker processes keep their shared counters (prometheus_client's multiprocess
mode): set by the supervisor, read by each worker's metrics."""

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TOKEN_GAP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
ROUND_TRIP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
PREDICTION_ERROR_BUCKETS = (
    *(-b for b in (10, 2.5, 1, 0.5, 0.25, 0.1, 0.05, 0.025, 0.01, 0.005, 0.001)),
    *(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)
"""Signed: actual minus predicted, early and late alike."""
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
STAGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536, 262144)


class Metrics:
    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call, unused-ignore]  # `*_created` series double the output for no use here
        self.registry = CollectorRegistry()
        r = self.registry
        self._requests = Counter(
            "pd_gateway_requests",
            "Answered requests by model, endpoint (chat, completions, responses; other for"
            " the rest), path, rule and HTTP status.",
            ["model", "endpoint", "path", "rule", "status"],
            registry=r,
        )
        self._unsupported = Counter(
            "pd_gateway_unsupported_requests",
            "Requests for OpenAI endpoints the gateway does not serve, by endpoint family.",
            ["endpoint"],
            registry=r,
        )
        self._reroutes = Counter(
            "pd_gateway_reroutes",
            "Requests moved to the throughput path, by kind and reason: `guard` for what the"
            " latency path cannot honour (a request field, a feature the node lacks), `spill`"
            " for a latency path that could not serve in time (saturated, failing).",
            ["model", "kind", "reason"],
            registry=r,
        )
        self._flushes = Counter(
            "pd_gateway_node_flushes",
            "Flushes of a TileRT node that may hold an orphaned transfer, by node and outcome"
            " (clean: idle afterwards; not_clean: busy or unreachable, tried again later).",
            ["node", "outcome"],
            registry=r,
        )
        self._queue_wait = Histogram(
            "pd_gateway_queue_wait_seconds",
            "Time spent waiting for a TileRT slot.",
            ["model", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._ttft = Histogram(
            "pd_gateway_ttft_seconds",
            "From the request to its first output (latency path: the first text; throughput"
            " path: the upstream's first body bytes), by path.",
            ["model", "path"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._token_gap = Histogram(
            "pd_gateway_inter_token_seconds",
            "Time per output token between stream lines (latency path: the node's token"
            " lines; throughput path: the upstream's stream events), by path.",
            ["model", "path"],
            buckets=TOKEN_GAP_BUCKETS,
            registry=r,
        )
        self._duration = Histogram(
            "pd_gateway_request_seconds",
            "From the request to the end of its answer, by path and finish reason (empty"
            " when the gateway did not read one: an error, a cut, a native answer without it).",
            ["model", "path", "finish_reason"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self._prompt_tokens = Counter(
            "pd_gateway_prompt_tokens",
            "Prompt tokens of answered requests, as their usage reports them, by path and API"
            " key name (a configured key's name, else `unknown`).",
            ["model", "path", "key"],
            registry=r,
        )
        self._completion_tokens = Counter(
            "pd_gateway_completion_tokens",
            "Completion tokens of answered requests, as their usage reports them, by path and"
            " API key name (a configured key's name, else `unknown`).",
            ["model", "path", "key"],
            registry=r,
        )
        self._in_flight = Gauge(
            "pd_gateway_requests_in_flight",
            "Requests being served, by the path decided for them.",
            ["path"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self._upstream_errors = Counter(
            "pd_gateway_upstream_errors",
            "Upstream failures on the latency path, by code.",
            ["model", "code"],
            registry=r,
        )
        self._native_ways = Counter(
            "pd_gateway_native_requests",
            "Requests of the native path in `pull` and `push` mode by how they were served:"
            " `split` into a prefill and a decode leg, or `whole` on a decode server, and why.",
            ["model", "way", "reason"],
            registry=r,
        )
        self._objectives = Counter(
            "pd_gateway_objective_requests",
            "Requests of rules with an objective, by rule, the way that served them and the"
            " outcome: `met` or `missed` (the measured first-token time and mean gap against the"
            " objective; a failed answer missed it), `unmeasured` (a non-streamed or Responses"
            " answer, whose token times the gateway does not see), `refused` (no way was"
            " predicted to meet it under `on_miss: reject`; way `none`).",
            ["model", "rule", "way", "outcome"],
            registry=r,
        )
        self._prediction_error = Histogram(
            "pd_gateway_prediction_error_seconds",
            "Actual minus predicted, for requests of rules with an objective: the first-token"
            " time (`quantity` ttft) and the mean gap between tokens (itl), by the way taken.",
            ["model", "way", "quantity"],
            buckets=PREDICTION_ERROR_BUCKETS,
            registry=r,
        )
        self._tenant_requests = Counter(
            "pd_gateway_tenant_requests",
            "Requests of each tenant (a name `tenants.named` configures, `default`, else"
            " `other`) by outcome: `admitted`, `limited_requests` or `limited_tokens` (a 429"
            " rate_limit_exceeded), `store_unavailable` (the limits' Redis unreachable: let"
            " through or refused as `tenants.on_store_unavailable` says).",
            ["tenant", "outcome"],
            registry=r,
        )
        self._tenant_node_seconds = Counter(
            "pd_gateway_tenant_node_seconds",
            "TileRT node time each tenant's answers held (their latency-path time less the"
            " wait for a node), by tenant (as pd_gateway_tenant_requests_total labels it).",
            ["tenant"],
            registry=r,
        )
        self._tenant_queue_wait = Histogram(
            "pd_gateway_tenant_queue_wait_seconds",
            "Each tenant's waits for a TileRT node that got one, by tenant.",
            ["tenant"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._continuations = Counter(
            "pd_gateway_continuations",
            "Answers whose decode broke mid-stream, by the node's or decode server's failure"
            " and what became of the answer: `continued` on another node, `continued_native`"
            " on the native path, `resent` whole to another decode server, or ended in error"
            " (`no_node` free in time, `too_long` for the pool, `limit` of continuations"
            " reached, `failed`).",
            ["model", "reason", "outcome"],
            registry=r,
        )
        self._cancellations = Counter(
            "pd_gateway_cancellations",
            "Decodes the gateway cancelled on a node, by reason.",
            ["model", "reason"],
            registry=r,
        )
        self._connections_refused = Counter(
            "pd_gateway_connections_refused",
            "Client connections refused or closed by the front door, by reason: max_connections"
            " (answered 503), overflow_reserve (closed unanswered), first_request_timeout,"
            " head_timeout, body_timeout (answered 408 or closed), headers_too_large (431).",
            ["reason"],
            registry=r,
        )
        self._prefill_inputs = Counter(
            "pd_gateway_prefill_inputs",
            "Latency prefills by how the prompt was sent (text, token_ids).",
            ["model", "input"],
            registry=r,
        )
        self._token_ids_proofs = Counter(
            "pd_gateway_prefill_token_ids_proofs",
            "Verdicts on whether a prefill server renders chat prompts as the gateway does"
            " (identical, differs, no_tokenize); only identical servers get token ids.",
            ["model", "server", "verdict"],
            registry=r,
        )
        self._stages = Histogram(
            "pd_gateway_stage_seconds",
            "Where an answered request's time went, by stage: `queue` (waiting for a TileRT"
            " slot), `prefill` (the prefill leg), `first_token` (from the prefill's end, or"
            " the start when there is none, to the first token: the KV transfer and the first"
            " decode step), `decode` (the first token to the answer's end).",
            ["model", "path", "stage"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self._request_prompt_tokens = Histogram(
            "pd_gateway_request_prompt_tokens",
            "Prompt tokens of each answered request.",
            ["model", "path"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self._request_completion_tokens = Histogram(
            "pd_gateway_request_completion_tokens",
            "Completion tokens of each answered request.",
            ["model", "path"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self._client_connections = Gauge(
            "pd_gateway_client_connections",
            "Client connections open (every worker's together).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self._reload_successful = Gauge(
            "pd_gateway_config_last_reload_successful",
            "1 if the configuration's last load (at start-up, or a reload) succeeded; 0 if"
            " the last reload failed, the configuration before it serving on.",
            registry=r,
            multiprocess_mode="livemin",
        )
        self._reload_success_time = Gauge(
            "pd_gateway_config_last_reload_success_timestamp_seconds",
            "When the configuration was last loaded successfully (Unix time).",
            registry=r,
            multiprocess_mode="livemin",
        )
        self._token_gap_children: dict[tuple[str, str], Any] = {}
        self._answered_children: dict[tuple[str, str], _AnsweredChildren] = {}
        self._pools = _PoolCollector()
        r.register(self._pools)
        self._upstreams = _UpstreamCollector()
        r.register(self._upstreams)
        self._kv_events = _KvEventsCollector()
        r.register(self._kv_events)
        self._sizing = _SizingCollector()
        r.register(self._sizing)
        r.register(BUILD_INFO)
        # Several worker processes (`router.process.workers`): each scrape reads every worker's
        # counters and histograms from the shared files, and this worker's pool gauges
        # (the pool's state is shared, so any worker's picture is the whole one).
        self._exposed = r
        if shared_dir := os.environ.get(METRICS_DIR_ENV):
            self._exposed = CollectorRegistry()
            MultiProcessCollector(self._exposed, path=shared_dir)  # type: ignore[no-untyped-call, unused-ignore]
            self._exposed.register(self._pools)
            self._exposed.register(self._upstreams)
            self._exposed.register(self._kv_events)
            self._exposed.register(self._sizing)
            self._exposed.register(BUILD_INFO)
            # Whichever worker answers a scrape, the series are every worker's, by pid: one
            # worker's own would jump from process to process between scrapes.
            self._exposed.register(WorkerProcesses())
        else:
            self._exposed.register(PROCESS_COLLECTOR)
        self._exposed.register(PLATFORM_COLLECTOR)
        self.gate = GateMetrics(r)

    def configuration_loaded(self, *, successful: bool) -> None:
        """The configuration was loaded (at start-up or by a reload), or a reload failed."""
        self._reload_successful.set(1 if successful else 0)
        if successful:
            self._reload_success_time.set_to_current_time()

    def request(self, model: str, endpoint: str, path: str, rule: str, status: int) -> None:
        self._requests.labels(model, endpoint, path, rule, str(status)).inc()

    def prefill_input(self, model: str, kind: str) -> None:
        self._prefill_inputs.labels(model, kind).inc()

    def token_ids_proof(self, model: str, server: str, verdict: str) -> None:
        self._token_ids_proofs.labels(model, server, verdict).inc()

    def unsupported(self, endpoint: str) -> None:
        self._unsupported.labels(endpoint).inc()

    def flushed(self, node: str, *, clean: bool) -> None:
        self._flushes.labels(node, "clean" if clean else "not_clean").inc()

    def reroute(self, model: str, reason: str, *, spill: bool) -> None:
        self._reroutes.labels(model, "spill" if spill else "guard", reason).inc()

    def queue_wait(self, model: str, seconds: float, *, granted: bool) -> None:
        self._queue_wait.labels(model, "granted" if granted else "rejected").observe(seconds)

    def first_token(self, model: str, path: str, seconds: float) -> None:
        self._ttft.labels(model, path).observe(seconds)

    def stream_gaps(self, model: str, path: str) -> StreamGaps:
        """One stream's gaps between lines, for the inter-token histogram (the labelled
        child is looked up once per model and path)."""
        child = self._token_gap_children.get((model, path))
        if child is None:
            child = self._token_gap_children[model, path] = self._token_gap.labels(model, path)
        return StreamGaps(child)

    def answered(self, record: AccessRecord, key: str) -> None:
        """A routed request's duration and tokens once its answer has ended, read off its
        access record; `key` is a bounded label (`key_label`)."""
        model, path = record.model or "", record.path or ""
        if record.duration_ms is not None:
            finish = record.finish_reason or ""
            self._duration.labels(model, path, finish).observe(record.duration_ms / 1e3)
        children = self._answered_children.get((model, path))
        if children is None:
            children = self._answered_children[model, path] = _AnsweredChildren(
                prompt=self._request_prompt_tokens.labels(model, path),
                completion=self._request_completion_tokens.labels(model, path),
                stages={},
            )
        if record.prompt_tokens:
            self._prompt_tokens.labels(model, path, key).inc(record.prompt_tokens)
            children.prompt.observe(record.prompt_tokens)
        if record.completion_tokens:
            self._completion_tokens.labels(model, path, key).inc(record.completion_tokens)
            children.completion.observe(record.completion_tokens)
        for stage, seconds in stages(record):
            child = children.stages.get(stage)
            if child is None:  # only the stages the path goes through are shown
                child = children.stages[stage] = self._stages.labels(model, path, stage)
            child.observe(seconds)
        if record.native_way is not None:
            reason = record.native_way_reason or ""
            self._native_ways.labels(model, record.native_way, reason).inc()

    def in_flight(self, path: str) -> Gauge:
        """The gauge of the requests in flight on `path`, for the response to raise and lower."""
        return self._in_flight.labels(path)

    @property
    def client_connections(self) -> Gauge:
        """The open client connections (the front door counts them up and down)."""
        return self._client_connections

    def connection_refused(self, reason: str) -> None:
        self._connections_refused.labels(reason).inc()

    def upstream_error(self, model: str, code: str) -> None:
        self._upstream_errors.labels(model, code).inc()

    def objective(self, model: str, rule: str, way: str, outcome: str) -> None:
        self._objectives.labels(model, rule, way, outcome).inc()

    def prediction_error(self, model: str, way: str, quantity: str, seconds: float) -> None:
        self._prediction_error.labels(model, way, quantity).observe(seconds)

    def tenant_answered(self, record: AccessRecord, tenant: str) -> None:
        """A tenant's answer has ended: the node time it held and its wait for the node."""
        if record.path != "latency" or record.node is None or record.duration_ms is None:
            return
        waited_ms = record.queue_wait_ms or 0.0
        self._tenant_node_seconds.labels(tenant).inc(max(0.0, record.duration_ms - waited_ms) / 1e3)
        if record.queue_wait_ms is not None:
            self._tenant_queue_wait.labels(tenant).observe(record.queue_wait_ms / 1e3)

    def tenant_request(self, tenant: str, outcome: str) -> None:
        self._tenant_requests.labels(tenant, outcome).inc()

    def continuation(self, model: str, reason: str, outcome: str) -> None:
        self._continuations.labels(model, reason, outcome).inc()

    def cancelled(self, model: str, reason: str) -> None:
        self._cancellations.labels(model, reason).inc()

    def render(
        self,
        pools: Mapping[str, GateSnapshot],
        upstreams: Mapping[str, Sequence[ServerSet]] | None = None,
        kv_events: Mapping[str, ServerBlocks] | None = None,
        sizes: Mapping[str, Sequence[PoolSize]] | None = None,
    ) -> bytes:
        """The exposition, with the pool gauges read from `pools` (model -> its snapshot),
        the vLLM servers' from `upstreams` (model -> its server sets), their KV-event
        indexes from `kv_events` (URL -> the index followed) and the pools' recommended
        sizes from `sizes` (model -> each pool's)."""
        self._pools.snapshots = pools
        self._upstreams.sets = upstreams or {}
        self._kv_events.followed = kv_events or {}
        self._sizing.sizes = sizes or {}
        return generate_latest(self._exposed)


class GateMetrics:
    """The shared gate's leases and its store's round trips: plain in-process counters,
    recorded where the gate already talks to its store (nothing per token)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self._grants = Counter(
            "pd_gateway_gate_lease_grants",
            "Node leases granted by the gate, by backend.",
            ["backend"],
            registry=r,
        )
        self._renewals = Counter(
            "pd_gateway_gate_lease_renewals",
            "Node leases renewed in the shared store.",
            registry=r,
        )
        self._renewal_failures = Counter(
            "pd_gateway_gate_lease_renewal_failures",
            "Node lease renewals that could not reach the shared store.",
            registry=r,
        )
        self._expiries = Counter(
            "pd_gateway_gate_lease_expiries",
            "Node leases found expired (or granted again) when renewed.",
            registry=r,
        )
        self._fencing = Counter(
            "pd_gateway_gate_lease_fencing_rejections",
            "Releases refused because the lease had been lost (a stale owner or token).",
            registry=r,
        )
        self._unreadable = Counter(
            "pd_gateway_gate_shared_records_unreadable",
            "Records other replicas shared that this one could not read, by reason"
            " (version: a node record in a newer format; malformed; state_version: the"
            " scripts' state in a format this release does not read; bucket_version: a"
            " tenant's rate bucket in one).",
            ["reason"],
            registry=r,
        )
        self._round_trip = Histogram(
            "pd_gateway_gate_redis_round_trip_seconds",
            "Round trips of the gate's Redis scripts, by script.",
            ["script"],
            buckets=ROUND_TRIP_BUCKETS,
            registry=r,
        )
        self._round_trip_children: dict[str, Any] = {}
        self._redis_up = Gauge(
            "pd_gateway_gate_redis_up",
            "1 while the gate's last call to Redis got an answer, 0 while it could not reach"
            " Redis (every gate call counts: acquires, the node prober's periodic read of the"
            " pool, the renewer's heartbeat, the pool snapshot each scrape reads); absent"
            " without a Redis gate.",
            ["deployment"],
            registry=r,
            multiprocess_mode="livemin",
        )

    def granted(self, backend: str) -> None:
        self._grants.labels(backend).inc()

    def renewed(self, leases: int) -> None:
        if leases:
            self._renewals.inc(leases)

    def renewal_failed(self, leases: int) -> None:
        if leases:
            self._renewal_failures.inc(leases)

    def expired(self) -> None:
        self._expiries.inc()

    def fencing_rejected(self) -> None:
        self._fencing.inc()

    def unreadable_record(self, reason: str) -> None:
        """`reason`: `version` or `malformed`."""
        self._unreadable.labels(reason).inc()

    def redis_reached(self, deployment: str, reached: bool) -> None:
        """`deployment`: the gate's Redis deployment (single, cluster, sentinel)."""
        self._redis_up.labels(deployment).set(1 if reached else 0)

    def round_trip(self, script: str, seconds: float) -> None:
        """`script` is one of the gate's fixed script names."""
        child = self._round_trip_children.get(script)
        if child is None:
            child = self._round_trip_children[script] = self._round_trip.labels(script)
        child.observe(seconds)


UNKNOWN_KEY = "unknown"
"""The key label of a request whose key name is not a configured key's."""


def key_label(name: str | None, configured: frozenset[str]) -> str:
    """A bounded label for an API key name: client-sent names are not."""
    return name if name is not None and name in configured else UNKNOWN_KEY


class WorkerProcesses(Collector):
    """prometheus-client's `process_*` series of every gateway worker (the supervisor's
    children), each labelled with its pid."""

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for pid in _sibling_pids():
            for family in ProcessCollector(pid=lambda: pid, registry=None).collect():  # noqa: B023
                merged = families.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type)
                )
                for sample in family.samples:
                    merged.add_sample(sample.name, {**sample.labels, "pid": str(pid)}, sample.value)
        yield from families.values()


def _sibling_pids() -> list[int]:
    """This process and the other children of its parent (Linux; only this one elsewhere)."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/task/{parent}/children", encoding="ascii") as listing:
            pids = [int(pid) for pid in listing.read().split()]
    except OSError:
        pids = []
    return pids or [os.getpid()]


class _PoolCollector(Collector):
    """Slot occupancy, node health and queue depth, from the pools' snapshots taken for
    this scrape (a shared pool's state can only be read asynchronously)."""

    def __init__(self) -> None:
        self.snapshots: Mapping[str, GateSnapshot] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        busy = GaugeMetricFamily(
            "pd_gateway_pool_slot_busy",
            "1 while a TileRT node's slot is held.",
            labels=["model", "node"],
        )
        up = GaugeMetricFamily(
            "pd_gateway_pool_node_in_service",
            "1 while a TileRT node is in service.",
            labels=["model", "node"],
        )
        waiting = GaugeMetricFamily(
            "pd_gateway_pool_queue_depth",
            "Requests waiting for a TileRT slot.",
            labels=["model"],
        )
        for model, snapshot in self.snapshots.items():
            for node, holder in snapshot.busy.items():
                busy.add_metric([model, node], 0 if holder is None else 1)
                up.add_metric([model, node], 0 if node in snapshot.out else 1)
            waiting.add_metric([model], snapshot.waiting)
        yield busy
        yield up
        yield waiting


class PoolSize(Protocol):
    """One pool's recommended size (router/capacity's `PoolSize`)."""

    @property
    def pool(self) -> str: ...
    @property
    def current(self) -> int: ...
    @property
    def demand(self) -> float: ...
    @property
    def recommended(self) -> int: ...


class _SizingCollector(Collector):
    """Each model's pools: members now, the members its load needs, and the recommendation
    (router/capacity): what the autoscaling objects read."""

    def __init__(self) -> None:
        self.sizes: Mapping[str, Sequence[PoolSize]] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["model", "pool"]
        current = GaugeMetricFamily(
            "pd_gateway_sizing_current_replicas",
            "Members of a pool now: TileRT nodes in service, vLLM servers configured.",
            labels=labels,
        )
        demand = GaugeMetricFamily(
            "pd_gateway_sizing_demand_replicas",
            "Members the load needs, unrounded: the TileRT pool's offered load in Erlangs"
            " (pool-wide); the prefill and decode servers this process's traffic needs at"
            " the sizing targets (add them up over replicas).",
            labels=labels,
        )
        recommended = GaugeMetricFamily(
            "pd_gateway_sizing_recommended_replicas",
            "Members recommended: TileRT nodes for the queue target (pool-wide); prefill and"
            " decode servers for this process's traffic.",
            labels=labels,
        )
        for model, pools in self.sizes.items():
            for size in pools:
                current.add_metric([model, size.pool], size.current)
                demand.add_metric([model, size.pool], size.demand)
                recommended.add_metric([model, size.pool], size.recommended)
        yield current
        yield demand
        yield recommended


SERVER_STATES = ("healthy", "failing", "ejected", "probation")
# A load figure of the admin snapshot -> its metric's name and help.
LOAD_FIGURES = {
    "running": ("requests_running", "Requests a vLLM server reports running"),
    "waiting": ("requests_waiting", "Requests a vLLM server reports waiting"),
    "kv_cache_usage": ("kv_cache_usage", "The share of its KV cache a vLLM server reports in use"),
}


class _UpstreamCollector(Collector):
    """Each vLLM server's (and proxy's) state, requests in flight, failures and ejections,
    as this process sees them (each process judges the servers by its own calls)."""

    def __init__(self) -> None:
        self.sets: Mapping[str, Sequence[ServerSet]] = {}

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["model", "set", "url"]
        state = GaugeMetricFamily(
            "pd_gateway_upstream_server_state",
            "1 for a vLLM server's current state (healthy, failing, ejected, probation).",
            labels=[*labels, "state"],
        )
        outstanding = GaugeMetricFamily(
            "pd_gateway_upstream_outstanding",
            "Requests in flight on a vLLM server.",
            labels=labels,
        )
        failures = CounterMetricFamily(
            "pd_gateway_upstream_failures",
            "Failed calls and probes of a vLLM server.",
            labels=labels,
        )
        ejections = CounterMetricFamily(
            "pd_gateway_upstream_ejections",
            "Times a vLLM server was ejected for failing.",
            labels=labels,
        )
        reported = {
            figure: GaugeMetricFamily(
                f"pd_gateway_upstream_{metric}",
                f"{help_text} (read from its /metrics; absent while not fresh).",
                labels=labels,
            )
            for figure, (metric, help_text) in LOAD_FIGURES.items()
        }
        for model, sets in self.sets.items():
            for servers in sets:
                figures = load_snapshot(servers)
                for url, seen in servers.snapshot().items():
                    key = [model, servers.name, url]
                    for name in SERVER_STATES:
                        state.add_metric([*key, name], 1 if seen["state"] == name else 0)
                    outstanding.add_metric(key, seen["outstanding"])
                    failures.add_metric(key, seen.get("failures", 0))
                    ejections.add_metric(key, seen.get("ejections", 0))
                    load = figures.get(url)
                    if load is not None and not load["stale"]:
                        for figure, family in reported.items():
                            family.add_metric(key, load[figure])
        yield state
        yield outstanding
        yield failures
        yield ejections
        yield from reported.values()


class _KvEventsCollector(Collector):
    """Each followed vLLM server's KV-event index, read at scrape time."""

    def __init__(self) -> None:
        self.followed: Mapping[str, ServerBlocks] = {}

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        state = GaugeMetricFamily(
            "pd_gateway_kv_events_state",
            "1 for the state of a vLLM server's KV-event index (waiting, live, unknown).",
            labels=["url", "state"],
        )
        blocks = GaugeMetricFamily(
            "pd_gateway_kv_events_blocks",
            "Blocks a vLLM server holds, by its KV events.",
            labels=["url"],
        )
        evictions = CounterMetricFamily(
            "pd_gateway_kv_events_evictions",
            "Blocks forgotten for the per-server cap while the server still held them.",
            labels=["url"],
        )
        lost = CounterMetricFamily(
            "pd_gateway_kv_events_lost",
            "Times a server's KV-event index was cleared as unknown, by reason.",
            labels=["url", "reason"],
        )
        last_message = GaugeMetricFamily(
            "pd_gateway_kv_events_last_message_timestamp_seconds",
            "When a vLLM server's last KV-event message arrived (Unix time; absent before the"
            " first).",
            labels=["url"],
        )
        ignored = CounterMetricFamily(
            "pd_gateway_kv_events_ignored",
            "KV events ignored, by reason (block_size: not the configured block size).",
            labels=["url", "reason"],
        )
        for url, server in self.followed.items():
            for name in KV_EVENTS_STATES:
                state.add_metric([url, name], 1 if server.state == name else 0)
            blocks.add_metric([url], server.size())
            if server.last_message_at is not None:
                last_message.add_metric([url], server.last_message_at)
            evictions.add_metric([url], server.evictions)
            for reason, count in server.lost.items():
                lost.add_metric([url, reason], count)
            for reason, count in server.ignored.items():
                ignored.add_metric([url, reason], count)
        yield from (state, blocks, last_message, evictions, lost, ignored)


@dataclass(frozen=True, slots=True)
class _AnsweredChildren:
    """The histograms an answered request of one model and path is observed into, labelled
    once (a label lookup costs more than the observation)."""

    prompt: Any
    completion: Any
    stages: dict[str, Any]
    """By stage, labelled when the first request goes through it."""


def stages(record: AccessRecord) -> Iterator[tuple[str, float]]:
    """The stages of an answered request its record times, in seconds: the queue and the
    prefill where they happened, the first token after them, the decode after it."""
    queue_ms, prefill_ms = record.queue_wait_ms, record.prefill_ms
    if queue_ms is not None:
        yield "queue", queue_ms / 1e3
    if prefill_ms is not None:
        yield "prefill", prefill_ms / 1e3
    if record.ttft_ms is None:
        return
    before_ms = (queue_ms or 0.0) + (prefill_ms or 0.0)
    yield "first_token", max(record.ttft_ms - before_ms, 0.0) / 1e3
    if record.duration_ms is not None:
        yield "decode", max(record.duration_ms - record.ttft_ms, 0.0) / 1e3


class _BuildInfo(Collector):
    """`pd_gateway_build_info`: 1, labelled with the release and the Python it runs on."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        info = GaugeMetricFamily(
            "pd_gateway_build_info",
            "1, labelled with the gateway's version and the Python it runs on.",
            labels=["version", "python"],
        )
        info.add_metric([__version__, platform.python_version()], 1)
        yield info


BUILD_INFO = _BuildInfo()


class StreamGaps:
    """A stream's time per token between its lines, counted into the histogram's buckets
    as they come and added to the histogram a batch at a time (every `BATCH` gaps and at
    the stream's end, `flush`): a line costs a bisect, not a locked `observe` of each
    bucket value. The totals are the same as observing each gap."""

    BATCH = 64
    __slots__ = ("_bounds", "_child", "_counts", "_pending", "_sum")

    def __init__(self, child: Any) -> None:
        self._child = child
        # prometheus_client's Histogram keeps its bounds and one value per bucket and for
        # the sum (the values it increments itself, in this process or its multiprocess
        # files); they are added to here as `observe` adds to them.
        self._bounds: list[float] = child._upper_bounds
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._pending = 0

    def line(self, seconds: float, tokens: int) -> None:
        """`tokens` more arrived `seconds` after the line before (none: not a gap)."""
        if tokens > 0:
            per_token = seconds / tokens
            self._counts[bisect_left(self._bounds, per_token)] += 1
            self._sum += per_token
            self._pending += 1
            if self._pending >= self.BATCH:
                self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        buckets = self._child._buckets
        for index, count in enumerate(self._counts):
            if count:
                buckets[index].inc(count)
                self._counts[index] = 0
        self._child._sum.inc(self._sum)
        self._sum, self._pending = 0.0, 0
