"""What the gate tells of its leases and its store, for metrics: one small interface the
gate's backends call where they already grant, renew or release (nothing per token).
`router.telemetry.metrics.GateMetrics` records them; `UNRECORDED` is a gate built without
the application's metrics (tests, tools)."""

from __future__ import annotations

from typing import Protocol


class GateEvents(Protocol):
    def granted(self, backend: str) -> None: ...

    def renewed(self, leases: int) -> None: ...

    def renewal_failed(self, leases: int) -> None: ...

    def expired(self) -> None: ...

    def fencing_rejected(self) -> None: ...

    def unreadable_record(self, reason: str) -> None:
        """`reason`: `version` or `malformed` (a node record, records.py), `state_version`
        (the scripts' state, state_format.py) or `bucket_version` (a tenant's bucket,
        router/tenants/limiter.py)."""

    def redis_reached(self, deployment: str, reached: bool) -> None:
        """`deployment`: the gate's Redis deployment (single, cluster, sentinel)."""

    def round_trip(self, script: str, seconds: float) -> None:
        """`script` is one of the gate's fixed script names."""


class Unrecorded:
    """GateEvents that nobody records."""

    def granted(self, backend: str) -> None:
        pass

    def renewed(self, leases: int) -> None:
        pass

    def renewal_failed(self, leases: int) -> None:
        pass

    def expired(self) -> None:
        pass

    def fencing_rejected(self) -> None:
        pass

    def unreadable_record(self, reason: str) -> None:
        pass

    def redis_reached(self, deployment: str, reached: bool) -> None:
        pass

    def round_trip(self, script: str, seconds: float) -> None:
        pass


UNRECORDED: GateEvents = Unrecorded()
