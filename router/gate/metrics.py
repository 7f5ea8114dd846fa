"""The gate's lease metrics: plain counters, recorded where a backend already grants,
renews or releases (nothing per token), registered with the application's registry by
`router.telemetry.metrics.Metrics`."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

ROUND_TRIP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


class GateMetrics:
    """The shared gate's leases and its store's round trips: plain in-process counters,
    recorded where the gate already talks to its store (nothing per token)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        """Unregistered (`registry` None) they count all the same, seen by nobody."""
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
            " (version: written in a newer format; malformed).",
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
