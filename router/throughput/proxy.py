"""`proxy` mode (docs/protocols.md §2.1): hand the request to an existing disaggregation proxy.

The body goes out as the client sent it (kv_transfer_params already removed) and the answer
comes back as the proxy sent it, status, content type and bytes, errors included.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from router.config import ProxyConfig
from router.selection.least_outstanding import LeastOutstanding
from router.serving import Answer, RoutedRequest
from router.throughput.answer import read_unless_streamed, relay
from router.upstream import Upstreams
from router.upstream.vllm import PROXY


class ProxyPath:
    """Forwards to the least busy of the configured proxy URLs."""

    def __init__(self, config: ProxyConfig, *, upstreams: Upstreams) -> None:
        self._upstreams = upstreams
        self._proxy = LeastOutstanding(config.urls)

    async def open(self, request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        url = stack.enter_context(self._proxy.hold(self._proxy.pick()))
        # A non-stream answer only arrives when generation ends: no bound on that wait.
        read_s = self._upstreams.timeouts.prefill_s if request.parsed.stream else None
        reply = await self._upstreams.open(
            PROXY,
            "POST",
            url,
            request.endpoint.path,
            body=request.native_body,
            read_s=read_s,
            request_id=request.request_id,
            stack=stack,
        )
        return relay(await read_unless_streamed(reply), request.endpoint.stream_failure)
