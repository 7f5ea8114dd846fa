"""`proxy` mode (docs/protocols.md §2.1): hand the request to an existing disaggregation proxy.

The body goes out as the client sent it (kv_transfer_params already removed) and the answer
comes back as the proxy sent it, status, content type and bytes, errors included; but an
answer that cannot have a body (204, 304) is the proxy's failure, a 502 naming its status.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from router.objectives import WayFacts
from router.selection import Affinity, Choice, ServerSet, call_on, status_outcome
from router.serving import Answer, RoutedRequest
from router.telemetry import tracing
from router.throughput.answer import forward, read_unless_streamed
from router.throughput.legs import NativeDeps, chosen
from router.throughput.stream_usage import asks_for_usage, with_usage
from router.throughput.whole import WholeServing
from router.upstream import Reply
from router.upstream.failures import BODILESS, bodiless_failure
from router.upstream.vllm import PROXY


class ProxyPath:
    """Forwards to a healthy proxy URL, the least busy first."""

    def __init__(self, proxy: ServerSet, deps: NativeDeps) -> None:
        self._upstreams = deps.upstreams
        self._metrics = deps.metrics
        self._proxy = proxy
        self.whole = WholeServing(proxy, PROXY, deps.upstreams)

    def server_sets(self) -> list[ServerSet]:
        return [self._proxy]

    async def affinity(self, request: RoutedRequest, *, always: bool = False) -> Affinity | None:
        """Nothing: the proxy chooses its own servers."""
        return None

    def native_facts(
        self, request: RoutedRequest, affinity: Affinity | None, tokens: int
    ) -> list[WayFacts]:
        """For an objective: one native way, the proxy's (whole or split, as it decides),
        predicted as whole on the proxy it would be sent to."""
        choice = self._proxy.pick()
        running = self._proxy.running(choice.url) + 1
        return [WayFacts("whole", tokens, choice, running=running, label="proxy")]

    async def open(self, request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        # A non-stream answer only arrives when generation ends: it is bounded as a whole.
        prefill_s = self._upstreams.timeouts.prefill_s
        total_s = None if request.parsed.stream else prefill_s
        body = request.native_body
        if asks_for_usage(request):
            body = with_usage(body)

        async def send(choice: Choice) -> Reply:
            chosen(request, choice, self._proxy)
            with tracing.stage(tracing.PROXY, upstream=choice.url):
                reply = await self._upstreams.open(
                    PROXY,
                    "POST",
                    choice.url,
                    request.endpoint.path,
                    body=body,
                    read_s=prefill_s,
                    total_s=total_s,
                    request_id=request.request_id,
                    stack=stack,
                )
                tracing.upstream_answered(reply.status)
                if reply.status in BODILESS:
                    raise bodiless_failure(reply.target, reply.status)
                return await read_unless_streamed(reply)

        planned = request.planned.native if request.planned is not None else None
        reply = await call_on(
            self._proxy,
            send,
            hold_on=stack,
            judge=lambda r: status_outcome(r.status),
            first=self._proxy.still(planned.facts.decode if planned is not None else None),
        )
        return forward(reply, request, self._metrics)
