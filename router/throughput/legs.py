"""The two legs of vLLM's NIXL disaggregation (docs/protocols.md §2.2, §2.3), shared by pull and
push: the prefill leg, and the decode leg whose answer is the client's."""

from __future__ import annotations

import logging
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from router.errors import UpstreamError
from router.objectives import WayFacts
from router.selection import Affinity, Choice, PathSelection, ServerSet, call_on
from router.serving import Answer, RoutedRequest
from router.telemetry import tracing
from router.telemetry.metrics import Metrics
from router.throughput.answer import forward, read_unless_streamed
from router.throughput.continuation import (
    Continuation,
    Continuing,
    StreamTrack,
    continuable,
    with_token_ids,
)
from router.throughput.stream_usage import asks_for_usage, with_usage
from router.throughput.usage import CachedTokensRewriter
from router.throughput.whole import WholeServing
from router.upstream import Reply, Upstreams, vllm
from router.upstream.vllm import NixlPrefilled

log = logging.getLogger("pd_gateway.throughput")

DECODE_BROKE = vllm.DECODE.code("broken")
DECODE_TIMED_OUT = vllm.DECODE.code("timeout")


@dataclass(frozen=True, slots=True)
class WholeWhen:
    """When a split mode serves a request whole on its decode server (conditional
    disaggregation; the configuration's `conditional`)."""

    min_uncached_tokens: int = 0
    prefill_busier_by: int | None = None


@dataclass(frozen=True, slots=True)
class NativeDeps:
    """What every native mode calls with. `continuing`: how `pull` and `push` go on with a
    stream whose decode server broke (none: they do not)."""

    upstreams: Upstreams
    metrics: Metrics | None = None
    continuing: Continuing | None = None


class SplitPath:
    """What pull and push share: a prefill set and a decode set, chosen by one selection."""

    def __init__(
        self,
        prefill: ServerSet,
        decode: ServerSet,
        selection: PathSelection,
        deps: NativeDeps,
        whole_when: WholeWhen | None = None,
    ) -> None:
        self._prefill = prefill
        self._decode = decode
        self._selection = selection
        self._upstreams = deps.upstreams
        self._metrics = deps.metrics
        self._continuing = deps.continuing
        self._whole_when = whole_when
        self.whole = WholeServing(decode, vllm.DECODE, deps.upstreams)

    def server_sets(self) -> list[ServerSet]:
        return [self._prefill, self._decode]

    async def affinity(self, request: RoutedRequest, *, always: bool = False) -> Affinity | None:
        """What `request` offers the scorers (worked out once: kept on the request)."""
        return await self._selection.affinity(
            self.server_sets(),
            request.endpoint.wire,
            request.body,
            request.client_headers,
            # The prompt's length decides whether to split.
            always=always or self._whole_when is not None,
            known=request.affinities,
        )

    def going_on(self, request: RoutedRequest, stack: AsyncExitStack) -> Continuation | None:
        """How `request`'s stream goes on if its decode server breaks mid-way; None: it
        does not (not configured, or not an answer that can, `continuable`)."""
        continuing = self._continuing
        if continuing is None or continuing.limit < 1 or not continuable(request):
            return None
        track = StreamTrack(keep_ids=bool(request.body.get("return_token_ids")))
        return Continuation(continuing, request, track, self.whole, stack)

    def resends(self, request: RoutedRequest, failure: BaseException) -> bool:
        """Whether a whole (not streamed) answer whose decode server broke before the answer
        was whole is served again on another: none of it reached the client."""
        continuing = self._continuing
        return (
            continuing is not None
            and continuing.limit > 0
            and not request.parsed.stream
            and request.endpoint.name in ("chat", "completions")
            and isinstance(failure, UpstreamError)
            and failure.code in (DECODE_BROKE, DECODE_TIMED_OUT)
        )

    async def resent(
        self,
        request: RoutedRequest,
        stack: AsyncExitStack,
        affinity: Affinity | None,
        failure: UpstreamError,
    ) -> Answer:
        """`request` served whole, prefill included, on another decode server than the one
        that broke (`resends`), up to `continuations` times."""
        assert self._continuing is not None
        model, limit, access = self._continuing.model, self._continuing.limit, request.access

        async def whole(choice: Choice) -> Answer:
            chosen(request, choice, self._decode)
            return await whole_on_decode(self._upstreams, stack, choice.url, request, self._metrics)

        while True:
            broken = access.upstream
            access.broken_servers = ",".join(filter(None, [access.broken_servers, broken]))
            reason = "decode_stalled" if failure.code == DECODE_TIMED_OUT else "decode_failed"
            if access.continued >= limit:
                self._continued(model, reason, "limit")
                raise failure
            log.warning(
                "request %s: decode server %s failed (%s): sent again whole",
                request.request_id,
                broken,
                failure.message,
            )
            self._continued(model, reason, "resent")
            access.continued += 1
            first = self._decode.pick(exclude=[broken] if broken else (), request=affinity)
            with tracing.stage(tracing.CONTINUATION, reason=reason, tokens=0):
                try:
                    return await call_on(
                        self._decode, whole, hold_on=stack, request=affinity, first=first
                    )
                except UpstreamError as exc:
                    if not self.resends(request, exc):
                        raise
                    failure = exc

    def _continued(self, model: str, reason: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.continuation(model, reason, outcome)

    def native_facts(
        self, request: RoutedRequest, affinity: Affinity | None, tokens: int
    ) -> list[WayFacts]:
        """For an objective: what is known of serving `request` (`tokens` long) whole on
        the decode server it would be sent to, and of splitting it (where it can be)."""
        decode = self._decode.pick(request=affinity)
        held = self._decode.cached_tokens(decode.url, affinity) if affinity is not None else 0
        running = self._decode.running(decode.url) + 1
        facts = [WayFacts("whole", max(0, tokens - held), decode, running=running)]
        if request.splits:
            prefill = self._prefill.pick(request=affinity)
            held = self._prefill.cached_tokens(prefill.url, affinity) if affinity else 0
            facts.append(WayFacts("split", max(0, tokens - held), decode, prefill, running=running))
        return facts

    def _whole_on(self, request: RoutedRequest, affinity: Affinity | None) -> Choice | None:
        """The decode server to serve `request` whole on, prefill included, when splitting
        it would not pay (or cannot be done), or its objective chose it; None: split. The
        way and why are recorded."""
        native = request.planned.native if request.planned is not None else None
        planned_decode = self._decode.still(native.facts.decode if native is not None else None)
        if not request.splits:
            _served(
                request, "whole", "scores_prompt" if request.parsed.scores_prompt else "not_split"
            )
            return planned_decode or self._decode.pick(request=affinity)
        if native is not None:
            _served(request, native.way, "objective")
            request.access.uncached_tokens = native.facts.uncached
            if native.way == "split":
                return None
            return planned_decode or self._decode.pick(request=affinity)
        rule = self._whole_when
        if rule is None:
            _served(request, "split", "always")
            return None
        choice = self._decode.pick(request=affinity)
        if affinity is not None and affinity.tokens:
            uncached = affinity.tokens - self._decode.cached_tokens(choice.url, affinity)
            request.access.uncached_tokens = uncached
            if uncached <= rule.min_uncached_tokens:
                _served(request, "whole", "cached")
                return choice
        if rule.prefill_busier_by is not None:
            busier_by = self._prefill.least_outstanding() - self._decode.outstanding()[choice.url]
            if busier_by >= rule.prefill_busier_by:
                _served(request, "whole", "prefill_busy")
                return choice
        _served(request, "split", "uncached")
        return None


NATIVE_HEADER = "x-pd-native"


def _served(request: RoutedRequest, way: str, reason: str) -> None:
    """How a request of the split modes is served, and why: in its access record and its
    answer's `x-pd-native`."""
    request.access.native_way, request.access.native_way_reason = way, reason
    request.headers[NATIVE_HEADER] = f"{way}; reason={reason}"


def chosen(request: RoutedRequest, choice: Choice, servers: ServerSet) -> None:
    """Record the server whose answer the client gets, why it was chosen, and how many
    requests it has in flight with this one (called once it is held for the request)."""
    access = request.access
    access.upstream, access.upstream_reason = choice.url, choice.reason
    access.running = servers.running(choice.url)


async def run_prefill(upstreams: Upstreams, url: str, request: RoutedRequest) -> NixlPrefilled:
    """Send the prefill leg for the client's request and read what the decode leg needs."""
    body = vllm.prefill_body(request.body, vllm.nixl_prefill_params())
    started = time.monotonic()
    with tracing.stage(tracing.PREFILL, upstream=url):
        data = await vllm.prefill(
            upstreams, url, request.endpoint.path, body, request_id=request.request_id
        )
    prefilled = vllm.parse_nixl_prefilled(data, url=url, request_id=request.request_id)
    computed = None
    if prefilled.prompt_tokens is not None:
        computed = prefilled.prompt_tokens - prefilled.cached_tokens
    request.access.prefilled(time.monotonic() - started, computed)
    return prefilled


async def send_decode(
    upstreams: Upstreams,
    stack: AsyncExitStack,
    url: str,
    request: RoutedRequest,
    body: dict[str, Any],
    go_on: Continuation | None = None,
) -> Reply:
    """Send the decode leg (naming each chunk's ids if `go_on` may continue it); an error
    status raises before anything is relayed."""
    # A non-stream answer only arrives when generation ends: it is bounded as a whole.
    prefill_s = upstreams.timeouts.prefill_s
    if asks_for_usage(request):
        body = with_usage(body)
    if go_on is not None:
        body = with_token_ids(body)
    with tracing.stage(tracing.DECODE, upstream=url):
        reply = await upstreams.open(
            vllm.DECODE,
            "POST",
            url,
            request.endpoint.path,
            body=body,
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
    go_on: Continuation | None = None,
) -> Answer:
    """A request not split into legs (`SplitPath._whole_on`): the decode instance at `url`
    serves the client's body whole, prefill included."""
    reply = await send_decode(upstreams, stack, url, request, request.native_body, go_on)
    return forward(reply, request, metrics, go_on=go_on)


def decode_answer(
    reply: Reply,
    prefill: NixlPrefilled,
    request: RoutedRequest,
    metrics: Metrics | None,
    go_on: Continuation | None = None,
) -> Answer:
    """The decode leg's answer as the client sees it: unchanged but for `cached_tokens`."""
    rewriter = CachedTokensRewriter(prefill.cached_tokens)
    if go_on is not None:
        go_on.cached_tokens = prefill.cached_tokens
    if reply.content is not None:
        return forward(reply, request, metrics, body=rewriter.body(reply.content))
    return forward(reply, request, metrics, rewrite=rewriter, go_on=go_on)


def planned_servers(
    request: RoutedRequest, decode: ServerSet, prefill: ServerSet
) -> tuple[Choice | None, Choice | None]:
    """The decode and prefill servers a split request's objective was predicted for, each
    while its set still considers it (none without one: the legs choose)."""
    native = request.planned.native if request.planned is not None else None
    if native is None:
        return None, None
    return decode.still(native.facts.decode), prefill.still(native.facts.prefill)
