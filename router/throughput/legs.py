"""The two legs of vLLM's NIXL disaggregation (docs/protocols.md §2.2, §2.3), shared by pull and
push: the prefill leg, and the decode leg whose answer is the client's."""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from router.selection import Affinity, Choice, PathSelection, ServerSet
from router.serving import Answer, RoutedRequest
from router.telemetry import tracing
from router.telemetry.metrics import Metrics
from router.throughput.answer import forward, read_unless_streamed
from router.throughput.stream_usage import asks_for_usage, with_usage
from router.throughput.usage import CachedTokensRewriter
from router.throughput.whole import WholeServing
from router.upstream import Reply, Upstreams, vllm
from router.upstream.vllm import NixlPrefilled


@dataclass(frozen=True, slots=True)
class NativeDeps:
    """What every native mode calls with."""

    upstreams: Upstreams
    metrics: Metrics | None = None


class SplitPath:
    """What pull and push share: a prefill set and a decode set, chosen by one selection."""

    def __init__(
        self, prefill: ServerSet, decode: ServerSet, selection: PathSelection, deps: NativeDeps
    ) -> None:
        self._prefill = prefill
        self._decode = decode
        self._selection = selection
        self._upstreams = deps.upstreams
        self._metrics = deps.metrics
        self.whole = WholeServing(decode, vllm.DECODE, deps.upstreams)

    def server_sets(self) -> list[ServerSet]:
        return [self._prefill, self._decode]

    async def _affinity(self, request: RoutedRequest) -> Affinity | None:
        return await self._selection.affinity(
            self.server_sets(), request.endpoint.wire, request.body, request.client_headers
        )


def chosen(request: RoutedRequest, choice: Choice) -> None:
    """Record the server whose answer the client gets, and why it was chosen."""
    request.access.upstream, request.access.upstream_reason = choice.url, choice.reason


async def run_prefill(upstreams: Upstreams, url: str, request: RoutedRequest) -> NixlPrefilled:
    """Send the prefill leg for the client's request and read what the decode leg needs."""
    body = vllm.prefill_body(request.body, vllm.nixl_prefill_params())
    with tracing.stage(tracing.PREFILL, upstream=url):
        data = await vllm.prefill(
            upstreams, url, request.endpoint.path, body, request_id=request.request_id
        )
    return vllm.parse_nixl_prefilled(data, url=url, request_id=request.request_id)


async def send_decode(
    upstreams: Upstreams,
    stack: AsyncExitStack,
    url: str,
    request: RoutedRequest,
    body: dict[str, Any],
) -> Reply:
    """Send the decode leg; an error status raises before anything is relayed."""
    # A non-stream answer only arrives when generation ends: it is bounded as a whole.
    prefill_s = upstreams.timeouts.prefill_s
    with tracing.stage(tracing.DECODE, upstream=url):
        reply = await upstreams.open(
            vllm.DECODE,
            "POST",
            url,
            request.endpoint.path,
            body=with_usage(body) if asks_for_usage(request) else body,
            read_s=prefill_s,
            total_s=None if request.parsed.stream else prefill_s,
            request_id=request.request_id,
            stack=stack,
        )
        await read_unless_streamed(reply)
        if reply.status != 200:
            raise await reply.failure()
    return reply


async def whole_on_decode(
    upstreams: Upstreams,
    stack: AsyncExitStack,
    url: str,
    request: RoutedRequest,
    metrics: Metrics | None,
) -> Answer:
    """A request not split into legs (`RoutedRequest.splits`): the decode instance at
    `url` serves the client's body whole, prefill included."""
    reply = await send_decode(upstreams, stack, url, request, request.native_body)
    return forward(reply, request, metrics)


def decode_answer(
    reply: Reply, prefill: NixlPrefilled, request: RoutedRequest, metrics: Metrics | None
) -> Answer:
    """The decode leg's answer as the client sees it: unchanged but for `cached_tokens`."""
    rewriter = CachedTokensRewriter(prefill.cached_tokens)
    if reply.content is not None:
        return forward(reply, request, metrics, body=rewriter.body(reply.content))
    return forward(reply, request, metrics, rewrite=rewriter)
