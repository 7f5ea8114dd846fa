"""`pull` mode (PROTOCOLS.md §2.2): prefill first, then the decode instance reads its KV.

The prefill's `kv_transfer_params` names where the KV state waits; the decode leg carries it
verbatim along with the client's original body, and its answer is the client's.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import httpx

from router.balance import LeastOutstanding
from router.config import PullConfig, TimeoutsConfig
from router.throughput.legs import (
    decode_answer,
    decode_leg,
    prefill_leg,
    pull_decode_body,
    run_prefill,
)
from router.throughput.relay import RelayedPath
from router.throughput.upstream import Upstream, send_leg


class PullPath(RelayedPath):
    """Balances each leg over its own pool by requests in flight."""

    def __init__(
        self, config: PullConfig, *, http: httpx.AsyncClient, timeouts: TimeoutsConfig
    ) -> None:
        self._http = http
        self._timeouts = timeouts
        self._prefill = LeastOutstanding(config.prefill)
        self._decode = LeastOutstanding(config.decode)

    async def _open(
        self, body: dict[str, Any], path: str, request_id: str, stack: AsyncExitStack
    ) -> Upstream:
        with self._prefill.hold(self._prefill.pick()) as prefill_url:
            leg = prefill_leg(prefill_url, path, request_id, self._timeouts)
            prefill = await run_prefill(self._http, leg, body)
        decode_url = stack.enter_context(self._decode.hold(self._decode.pick()))
        leg = decode_leg(decode_url, path, request_id, self._timeouts, body=body)
        decode_body = pull_decode_body(body, prefill.kv_transfer_params)
        reply = await send_leg(self._http, leg, decode_body, stack)
        return decode_answer(reply, prefill)

    def outstanding(self) -> dict[str, dict[str, int]]:
        """Requests in flight per prefill and per decode URL."""
        return {"prefill": self._prefill.outstanding(), "decode": self._decode.outstanding()}
