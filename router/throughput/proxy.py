"""`proxy` mode (PROTOCOLS.md §2.1): hand the request to an existing disaggregation proxy.

The body goes out as the client sent it (kv_transfer_params already removed) and the answer
comes back as the proxy sent it, status, content type and bytes, errors included.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import httpx

from router.balance import LeastOutstanding
from router.config import ProxyConfig, TimeoutsConfig
from router.throughput.legs import is_stream
from router.throughput.relay import RelayedPath
from router.throughput.upstream import Leg, Upstream, leg_timeout, relay, send_leg


class ProxyPath(RelayedPath):
    """Forwards to the least busy of the configured proxy URLs."""

    def __init__(
        self, config: ProxyConfig, *, http: httpx.AsyncClient, timeouts: TimeoutsConfig
    ) -> None:
        self._http = http
        self._timeouts = timeouts
        self._balance = LeastOutstanding(config.urls)

    async def _open(
        self, body: dict[str, Any], path: str, request_id: str, stack: AsyncExitStack
    ) -> Upstream:
        url = stack.enter_context(self._balance.hold(self._balance.pick()))
        # A non-stream answer only arrives when generation ends: no bound on that wait.
        read_s = self._timeouts.prefill_s if is_stream(body) else None
        timeout = leg_timeout(self._timeouts, read_s=read_s)
        leg = Leg("proxy", url, path, request_id, timeout)
        return relay(await send_leg(self._http, leg, body, stack))

    def outstanding(self) -> dict[str, dict[str, int]]:
        """Requests in flight per proxy URL."""
        return {"proxy": self._balance.outstanding()}
