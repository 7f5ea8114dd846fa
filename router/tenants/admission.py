"""A tenant's request let in, or not, by its rate limits: one request and its tokens (the
prompt's, as classification bounded them, and `max_tokens`) taken from the tenant's
per-minute allowances when it is admitted, the tokens settled with the usage its answer
reports. Every answer to a tenant with a limit carries OpenAI's `x-ratelimit-*` headers;
over a limit, a 429 `rate_limit_exceeded` with `Retry-After`.

The counts live in a `Limiter`: in memory for one process, on the gate's Redis for every
replica at once.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from router.config import TenantsConfig
from router.errors import Overloaded, Unavailable
from router.telemetry.access import AccessRecord
from router.telemetry.metrics import Metrics
from router.tenants.identity import DEFAULT_TENANT
from router.tenants.limiter import Limiter, LimiterUnavailable, Rate, Verdict

log = logging.getLogger("pd_gateway.tenants")

OTHER = "other"
"""The metrics' label of a tenant the configuration does not name (labels stay bounded)."""
Spawn = Callable[[Coroutine[Any, Any, None]], object]


@dataclass(slots=True)
class Admitted:
    """A request let in: what it took, and the headers its answer carries."""

    tenant: str
    headers: dict[str, str] = field(default_factory=dict)
    tokens_taken: int = 0
    tokens_rate: Rate | None = None


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

    async def admit(self, tenant: str, tokens: int) -> Admitted:
        """Take one request and `tokens` from `tenant`'s allowances. Raises Overloaded (429
        `rate_limit_exceeded`) over a limit, Unavailable (503) when the counts cannot be
        reached and `on_store_unavailable: refuse`."""
        limits = self.config.limits_of(tenant)
        admitted = Admitted(tenant)
        self._seen_now(tenant)
        try:
            if limits.requests_per_minute is not None:
                rate = Rate(limits.requests_per_minute)
                verdict = await self._limiter.take(_key(tenant, "requests"), rate, 1)
                admitted.headers.update(_headers("requests", verdict))
                if not verdict.allowed:
                    raise self._limited(tenant, "requests", verdict, admitted.headers)
            if limits.tokens_per_minute is not None:
                rate = Rate(limits.tokens_per_minute)
                verdict = await self._limiter.take(_key(tenant, "tokens"), rate, tokens)
                admitted.headers.update(_headers("tokens", verdict))
                if not verdict.allowed:
                    if limits.requests_per_minute is not None:  # the request not served
                        requests = Rate(limits.requests_per_minute)
                        self._settle(_key(tenant, "requests"), requests, -1)
                    raise self._limited(tenant, "tokens", verdict, admitted.headers)
                admitted.tokens_taken, admitted.tokens_rate = tokens, rate
            self._metrics.tenant_request(self.label(tenant), "admitted")
        except LimiterUnavailable as exc:
            self._metrics.tenant_request(self.label(tenant), "store_unavailable")
            if self.config.on_store_unavailable == "refuse":
                raise Unavailable(
                    "the tenants' rate limits cannot be checked now; retry",
                    code="rate_limits_unavailable",
                ) from None
            log.warning("rate limits not checked (%s): letting the request through", exc)
            return Admitted(tenant)
        return admitted

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
                tenant: {"admitted": count, **self.config.limits_of(tenant).model_dump()}
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

    def _settle(self, key: str, rate: Rate, delta: int) -> None:
        async def settle() -> None:
            try:
                await self._limiter.settle(key, rate, delta)
            except LimiterUnavailable as exc:
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
    return f"{kind}:{tenant}"


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
