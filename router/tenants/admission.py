"""A tenant's request let in, or not, by its rate limits and its quota: one request and its
tokens (the prompt's, as classification bounded them, and `max_tokens`) taken from the
tenant's per-minute allowances when it is admitted, the tokens settled with the usage its
answer reports; the node time its answer held charged to its hourly quota as each node is
given back. Every answer to a tenant with a limit carries OpenAI's `x-ratelimit-*` headers;
over a limit, a 429 `rate_limit_exceeded` with `Retry-After`; a quota spent, a 429
`insufficient_quota` for a request only a node could serve (one that has other ways is
served without a node). The admitted request carries its tenant's `Share` of the pools.

The counts live in a `Limiter`: in memory for one process, on the gate's Redis for every
replica at once.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

from router.config import TenantConfig, TenantsConfig
from router.errors import Overloaded, Unavailable
from router.gate import UNSHARED, Share
from router.telemetry.access import AccessRecord
from router.telemetry.metrics import Metrics
from router.tenants.identity import DEFAULT_TENANT
from router.tenants.limiter import (
    Limiter,
    LimiterUnavailable,
    LimiterUnreadable,
    Rate,
    Take,
    Verdict,
)

log = logging.getLogger("pd_gateway.tenants")

OTHER = "other"
"""The metrics' label of a tenant the configuration does not name (labels stay bounded)."""
Spawn = Callable[[Coroutine[Any, Any, None]], object]
NodeUse = Literal["none", "maybe", "only"]
"""Whether a request may hold a TileRT node: not at all, as one way of several, or only."""
HOUR_S = 3600.0
CAP_REACHED = "tenant_max_nodes"
"""The gate's refusal of a node to a tenant at its `max_nodes`."""


@dataclass(slots=True)
class Admitted:
    """A request let in: what it took, the headers its answer carries, and its share."""

    tenant: str
    headers: dict[str, str] = field(default_factory=dict)
    tokens_taken: int = 0
    tokens_rate: Rate | None = None
    share: Share = UNSHARED
    node_quota: Rate | None = None
    """The quota its node time is charged to (node-milliseconds an hour)."""
    nodes_refused: bool = False
    """Its quota is spent: served by another way than a node."""


class Tenants:
    """One process's view of the tenants: the configuration, the shared counts, and the
    tenants seen lately (at most `max_tracked`)."""

    def __init__(
        self, config: TenantsConfig, limiter: Limiter, metrics: Metrics, spawn: Spawn
    ) -> None:
        self.config = config
        self._limiter = limiter
        self._metrics = metrics
        self._spawn = spawn
        self._seen: OrderedDict[str, int] = OrderedDict()  # tenant -> requests admitted

    def reconfigured(self, config: TenantsConfig) -> None:
        """A reload: the new limits from now on, the counts kept."""
        self.config = config

    def label(self, tenant: str) -> str:
        return tenant if tenant in self.config.named or tenant == DEFAULT_TENANT else OTHER

    def share_of(self, tenant: str, model: str) -> Share:
        return self._share(tenant, self.config.tenant(tenant), model)

    def _share(self, tenant: str, config: TenantConfig, model: str) -> Share:
        if not self.config.fair_share:
            return UNSHARED
        max_nodes = config.max_nodes_in(model)
        if config.weight == 1.0 and max_nodes is None and tenant == UNSHARED.tenant:
            return UNSHARED
        return Share(tenant, config.weight, max_nodes)

    async def admit(
        self, tenant: str, tokens: int, *, model: str = "", node_use: NodeUse = "none"
    ) -> Admitted:
        """Take one request and `tokens` from `tenant`'s allowances. Raises Overloaded (429
        `rate_limit_exceeded`) over a limit, or (429 `insufficient_quota`) when its node time
        is spent and only a node could serve it (`node_use`); Unavailable (503) when the
        counts cannot be reached and `on_store_unavailable: refuse`."""
        limits = self.config.tenant(tenant)
        admitted = Admitted(tenant, share=self._share(tenant, limits, model))
        self._seen_now(tenant)
        takes: dict[str, Take] = {}  # by kind; one call takes them all, or none
        if limits.node_seconds_per_hour is not None and node_use != "none":
            quota = Rate(max(1, round(limits.node_seconds_per_hour * 1000)), HOUR_S)
            # Only looked at: a quota is charged as nodes are given back.
            takes["node_ms"] = Take(_key(tenant, "node_ms"), quota, 0, binds=node_use == "only")
        if limits.requests_per_minute is not None:
            takes["requests"] = Take(_key(tenant, "requests"), Rate(limits.requests_per_minute), 1)
        if limits.tokens_per_minute is not None:
            rate = Rate(limits.tokens_per_minute)
            takes["tokens"] = Take(_key(tenant, "tokens"), rate, tokens)
        if takes:
            try:
                verdicts = dict(
                    zip(takes, await self._limiter.take_all(list(takes.values())), strict=True)
                )
            except LimiterUnavailable as exc:
                self._metrics.tenant_request(self.label(tenant), "store_unavailable")
                self._unreadable(exc)
                if self.config.on_store_unavailable == "refuse":
                    raise Unavailable(
                        "the tenants' rate limits cannot be checked now; retry",
                        code="rate_limits_unavailable",
                    ) from None
                log.warning("rate limits not checked (%s): letting the request through", exc)
                return admitted
            self._judge(admitted, takes, verdicts, limits, node_use)
        self._metrics.tenant_request(self.label(tenant), "admitted")
        return admitted

    def _judge(
        self,
        admitted: Admitted,
        takes: dict[str, Take],
        verdicts: dict[str, Verdict],
        limits: TenantConfig,
        node_use: NodeUse,
    ) -> None:
        """The headers, and a 429 for the first limit the request does not fit (nothing was
        then taken); a quota spent refuses a request only a node could serve."""
        tenant = admitted.tenant
        for kind in ("requests", "tokens"):
            if kind in verdicts:
                admitted.headers.update(_headers(kind, verdicts[kind]))
        for kind in ("requests", "tokens"):
            if kind in verdicts and not verdicts[kind].allowed:
                raise self._limited(tenant, kind, verdicts[kind], admitted.headers)
        if "node_ms" in verdicts:
            admitted.node_quota = takes["node_ms"].rate
            if not verdicts["node_ms"].allowed:
                if node_use == "maybe":
                    admitted.nodes_refused = True
                else:
                    raise self._quota_spent(tenant, limits, verdicts["node_ms"])
        if "tokens" in takes:
            admitted.tokens_taken, admitted.tokens_rate = takes["tokens"].cost, takes["tokens"].rate

    def _quota_spent(self, tenant: str, limits: TenantConfig, verdict: Verdict) -> Overloaded:
        self._metrics.tenant_request(self.label(tenant), "insufficient_quota")
        retry_after_s = max(1, math.ceil(verdict.retry_after_s))
        return Overloaded(
            f"tenant {tenant!r} has used its TileRT node time for the hour"
            f" ({limits.node_seconds_per_hour:g} node-seconds); retry in {retry_after_s} s",
            retry_after_s=retry_after_s,
            code="insufficient_quota",
        )

    def node_released(self, admitted: Admitted, held_s: float) -> None:
        """A node the request held has been given back after `held_s`: charged to its
        quota, in the background."""
        if admitted.node_quota is not None and held_s > 0:
            self._settle(
                _key(admitted.tenant, "node_ms"), admitted.node_quota, round(held_s * 1000)
            )

    def answered(
        self, admitted: Admitted, access: AccessRecord, reroute_reason: str | None
    ) -> None:
        """The request's answer has ended: its tokens settled with its usage, and a request
        its tenant's cap kept from a node (refused, or spilled: `reroute_reason`) counted."""
        self.settle(admitted, used_tokens(access))
        if CAP_REACHED in (access.error_code, reroute_reason):
            self._metrics.tenant_request(self.label(admitted.tenant), "max_nodes")

    def settle(self, admitted: Admitted, used_tokens: int | None) -> None:
        """The answer used `used_tokens` in all (prompt and completion; None: not known):
        the difference from what was taken is charged or given back, in the background."""
        rate = admitted.tokens_rate
        if rate is None or used_tokens is None:
            return
        delta = used_tokens - admitted.tokens_taken
        if delta:
            self._settle(_key(admitted.tenant, "tokens"), rate, delta)

    async def close(self) -> None:
        await self._limiter.close()

    def snapshot(self) -> dict[str, Any]:
        """For `GET /admin/tenants`: each tenant seen lately, its limits and requests let in."""
        return {
            "tracked": len(self._seen),
            "max_tracked": self.config.max_tracked,
            "tenants": {
                tenant: {"admitted": count, **self.config.tenant(tenant).model_dump()}
                for tenant, count in reversed(self._seen.items())
            },
        }

    def _seen_now(self, tenant: str) -> None:
        seen = self._seen
        seen[tenant] = seen.pop(tenant, 0) + 1
        while len(seen) > self.config.max_tracked:
            seen.popitem(last=False)  # the least recently seen

    def _limited(
        self, tenant: str, kind: str, verdict: Verdict, headers: dict[str, str]
    ) -> Overloaded:
        self._metrics.tenant_request(self.label(tenant), f"limited_{kind}")
        retry_after_s = max(1, math.ceil(verdict.retry_after_s))
        error = Overloaded(
            f"rate limit reached for tenant {tenant!r} on {kind} per minute: limit"
            f" {verdict.limit}; retry in {retry_after_s} s",
            retry_after_s=retry_after_s,
            code="rate_limit_exceeded",
        )
        error.headers.update(headers)
        return error

    def _unreadable(self, exc: LimiterUnavailable) -> None:
        """A bucket stored in a version this release does not read (docs/upgrades.md): an
        error, counted with the gate's unreadable shared records."""
        if isinstance(exc, LimiterUnreadable):
            self._metrics.gate.unreadable_record("bucket_version")
            log.error("%s: nothing counted", exc)

    def _settle(self, key: str, rate: Rate, delta: int) -> None:
        async def settle() -> None:
            try:
                await self._limiter.settle(key, rate, delta)
            except LimiterUnavailable as exc:
                self._unreadable(exc)
                log.warning("a tenant's tokens could not be settled: %s", exc)

        self._spawn(settle())


def used_tokens(access: AccessRecord) -> int | None:
    """The tokens an answer used, prompt and completion, as its usage reported them; none
    for an answer refused or failed before it started (nothing was generated); None where a
    started answer reported no usage."""
    if access.prompt_tokens is not None and access.completion_tokens is not None:
        return access.prompt_tokens + access.completion_tokens
    if (access.status or 200) >= 400 and access.ttft_ms is None:
        return 0
    return None


def _key(tenant: str, kind: str) -> str:
    """A tenant's bucket; its name in braces, so that a tenant's buckets, taken together,
    share one hash tag (a tenant's name has no braces)."""
    return f"{{{tenant}}}:{kind}"


def _headers(kind: str, verdict: Verdict) -> dict[str, str]:
    """OpenAI's `x-ratelimit-limit-<kind>`, `-remaining-` and `-reset-` (a duration such as
    `1s`, `6m0s`, `20ms`)."""
    return {
        f"x-ratelimit-limit-{kind}": str(verdict.limit),
        f"x-ratelimit-remaining-{kind}": str(max(0, verdict.remaining)),
        f"x-ratelimit-reset-{kind}": duration(verdict.reset_s),
    }


def duration(seconds: float) -> str:
    """As OpenAI writes a reset time: `20ms` under a second, else `1s`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text
