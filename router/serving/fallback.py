"""Spill as a composition: serve with the latency path, and move a request that fails there
before its first byte to the throughput path when the matched rule says `spill`."""

from __future__ import annotations

from contextlib import AsyncExitStack

from policies.decision import REROUTE_HEADER, ROUTE_HEADER
from router.errors import GatewayError, NodeRefused, Overloaded, PrefillError, UpstreamError
from router.serving.base import Answer, RoutedRequest, ServePath, new_request_id
from router.telemetry.metrics import Metrics


class Fallback:
    def __init__(self, primary: ServePath, secondary: ServePath, *, metrics: Metrics) -> None:
        self._primary = primary
        self._secondary = secondary
        self._metrics = metrics

    async def open(self, request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        try:
            return await self._primary.open(request, stack)
        except GatewayError as exc:
            if request.decision.on_saturation != "spill" or not spillable(exc):
                raise
            capability = isinstance(exc, NodeRefused)
            reason = NODE_CAPABILITY if capability else str(exc.code)
        self._metrics.reroute(request.model, reason, spill=not capability)
        request.headers.update({ROUTE_HEADER: "throughput", REROUTE_HEADER: reason})
        # The failed attempt's id may still be running upstream (a prefill that timed out).
        request.request_id = request.access.upstream_request_id = new_request_id()
        return await self._secondary.open(request, stack)


NODE_CAPABILITY = "node_capability"
"""The reroute reason when a TileRT node refused a feature its engine lacks."""


def spillable(exc: GatewayError) -> bool:
    """Saturation and upstream failures before the first byte, and features the TileRT node
    lacks, but not the client's own mistakes (a 4xx from the prefill server or the node's
    400 about a parameter would fail on the throughput path too)."""
    if isinstance(exc, NodeRefused):
        return exc.unsupported
    if isinstance(exc, PrefillError):
        return exc.status >= 500
    return isinstance(exc, Overloaded | UpstreamError)
