"""The latency path of one model: take a TileRT slot, run the node protocol, and answer in
OpenAI's shape from the decode relay."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator
from contextlib import AsyncExitStack
from typing import Any, Protocol

import orjson

from router.config import LatencyConfig
from router.errors import DecodeError, GatewayError, Overloaded, PrefillError, UpstreamError
from router.gate import CONTINUING, Gate, GateRejected, Lease
from router.latency.prompt_ids import PromptIds
from router.latency.protocol import CONTINUABLE, LatencyDeps, NodeSession, PrefillPrompt
from router.latency.relay import DecodeRelay, DecodeSource, RelayEnd, Resume
from router.latency.sampling import DecodeOptions, Sampling, SamplingDefaults, decode_options
from router.latency.token_ids_proof import TokenIdsProof
from router.objectives import WayFacts
from router.openai.endpoints import WIRE_PATHS
from router.openai.render import AnswerFacts, AnswerHead, Renderer, Usage
from router.openai.requests import ChatRequest, CompletionRequest
from router.selection import (
    Affinity,
    Choice,
    PathSelection,
    ServerSet,
    outcome_of,
)
from router.serving import Answer, LastChunk, RoutedRequest, json_answer, new_request_id
from router.telemetry import tracing
from router.telemetry.access import AccessRecord
from router.tokens.tokenizer import LoadedTokenizer
from router.upstream import Reply, vllm
from router.upstream.native_decode import NativeDecode
from router.upstream.vllm import Prefilled

log = logging.getLogger("pd_gateway.latency")

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]

OBJECTIVE_DEADLINE = "objective_deadline"
"""A request planned for a node found none free by its objective's deadline."""

LATENCY_SERVICE_TIER = "priority"
"""The tier a latency answer reports to a client that asked for one (OpenAI's
`service_tier`)."""

_REJECTED = {
    "queue_full": "all TileRT decode nodes are busy and the queue is full; retry later",
    "wait_timeout": "no TileRT decode node became free within the wait budget; retry later",
    "pool_saturated": "every TileRT decode node is busy; retry later",
    "tenant_max_nodes": "the tenant holds as many TileRT decode nodes as it may; retry later",
    "no_node": "no TileRT decode node is available; retry later",
    "gate_unavailable": "the TileRT pool's shared state cannot be reached; retry later",
}


class WholeServers(Protocol):
    """The servers of the model's native path that serve a request whole
    (`router.throughput.whole.WholeServing`)."""

    async def open_stream(
        self, path: str, body: dict[str, Any], *, request_id: str, stack: AsyncExitStack
    ) -> tuple[Reply, Choice]: ...


class LatencyPath:
    def __init__(
        self,
        model: str,
        config: LatencyConfig,
        *,
        output_parser: str,
        gate: Gate,
        tokenizer: LoadedTokenizer,
        deps: LatencyDeps,
        selection: PathSelection | None = None,
        default_wait_ms: int,
        sampling_defaults: SamplingDefaults,
        prompt_ids: PromptIds | None = None,
        native: WholeServers | None = None,
    ) -> None:
        """`prompt_ids`: the model's own rendering and encoding, for
        `prefill_input: token_ids` (chat prompts then go as ids to the prefill servers
        proven to render as the gateway does). `native`: the model's native path's servers
        that serve whole, which go on with an answer whose node failed when no other node
        is free in time."""
        self._model = model
        self._config = config
        self._output_parser = output_parser
        self.gate = gate
        self._tokenizer = tokenizer
        self._deps = deps
        self._default_wait_ms = default_wait_ms
        self._sampling_defaults = sampling_defaults
        self._selection = selection = selection or PathSelection()
        # A node's transfer must come from a prefill server of its own pool (its release).
        self._prefill_of_pool: dict[str | None, ServerSet] = {
            pool.name: selection.server_set(pool.prefill, f"latency:prefill:{pool.name}")
            for pool in config.pools
        }
        # A node of a pool a reload added while this request waited: its release will do.
        self._prefill_of_release: dict[str | None, ServerSet] = {
            pool.tilert: self._prefill_of_pool[pool.name] for pool in config.pools
        }
        self._live: set[NodeSession] = set()  # sessions whose slot is not yet released
        self._native = native
        self._prompt_ids: PromptIds | None = None
        self._proof: TokenIdsProof | None = None
        if config.prefill_input == "token_ids" and prompt_ids is not None:
            if prompt_ids.exact:
                self._prompt_ids = prompt_ids
                self._proof = TokenIdsProof(model, prompt_ids, deps.upstreams, deps.metrics)
            else:
                log.warning(
                    "model %s: prefill_input token_ids needs the model's chat template "
                    "(tokenizer_config.json's chat_template): prompts go as text",
                    model,
                )

    async def open(self, request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        try:
            return await self._open(request, stack)
        except UpstreamError as exc:
            self._deps.metrics.upstream_error(self._model, str(exc.code))
            raise

    def server_sets(self) -> list[ServerSet]:
        return list(self._prefill_of_pool.values())

    async def _open(self, request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        started = time.monotonic()
        options = decode_options(request.parsed, request.body, self._sampling_defaults)
        # Before a slot is taken: encoding the prompt must not hold one.
        affinity = await self._affinity(request)
        ids = await self._token_ids(request)
        # A grammar is not continued: the next node (and its prefill) would start it afresh
        # on an output already under way.
        continuable = self._config.continuations > 0 and options.grammar_spec is None
        lease = await self._acquire(request, started)
        servers = await self._prefill_servers(lease)
        choice = _planned_prefill(request, servers) or servers.pick(request=affinity)
        session, released = self._session(request, lease, choice, stack)
        prompt = self._prompt(choice, ids, continuable)
        try:
            prefilled = await self._prefill(
                session, servers, choice, request, options, affinity, prompt
            )
        except PrefillError as exc:
            # Nothing reached the prefill server: the request goes once more, to another
            # one, on a slot taken again once this one is back in the pool.
            if outcome_of(exc) != "unreachable" or len(servers.urls) < 2:
                raise
            if not await _set_within(released, self._deps.timeouts.cancel_s):
                raise  # the slot is not back yet: no second slot for one request
            lease = await self._acquire(request, started)
            servers = await self._prefill_servers(lease)
            choice = servers.pick(exclude=[choice.url], request=affinity)
            session, _ = self._session(request, lease, choice, stack)
            prompt = self._prompt(choice, ids, continuable)
            prefilled = await self._prefill(
                session, servers, choice, request, options, affinity, prompt
            )
        request.access.prompt_tokens = prefilled.prompt_tokens
        prompt_ids = prompt.token_ids or prefilled.prompt_token_ids
        resume = None
        if continuable and prompt_ids is not None:
            resume = self._resumer(request, options, affinity, prompt_ids, stack)
        relay = DecodeRelay(
            request,
            prefilled,
            tokenizer=self._tokenizer,
            output_parser=self._output_parser,
            metrics=self._deps.metrics,
            started=started,
            top_logprobs=options.top_logprobs,
        )
        head = AnswerHead(
            prefilled.response_id,
            prefilled.created,
            self._model,
            request.client_body or {},
            answer_facts(request.parsed, prefilled, options.sampling, self._config.max_seq_len),
        )
        renderer = request.endpoint.renderer(head)
        if request.parsed.stream:
            parsed = request.parsed
            chunks = self._stream(
                request.access,
                session,
                resume,
                relay,
                renderer,
                prefilled,
                parsed.include_usage,
                parsed.continuous_usage,
            )
            return Answer(200, list(SSE_HEADERS), chunks)
        end = RelayEnd("stop", 0)
        with tracing.stage(tracing.DECODE, node=request.access.node):
            async for event in relay.events(session, resume):
                if isinstance(event, RelayEnd):
                    end = event
        body = renderer.response(
            relay.message(),
            end.finish_reason,
            end.stop_reason,
            _usage(prefilled, end),
            relay.all_logprobs(),
        )
        return json_answer(orjson.dumps(body))

    async def tilert_facts(
        self, request: RoutedRequest, tokens: int, *, wait_s: float | None = None
    ) -> WayFacts:
        """For an objective: the wait for a node of the pool (`wait_s`: as assumed), and the
        prefill server of the first pool the request would be sent to with what it holds of
        the prompt."""
        affinity = await self._affinity(request)
        servers = next(iter(self._prefill_of_pool.values()))
        choice = servers.pick(request=affinity)
        held = 0
        if affinity is not None and affinity.tokens:
            tokens = affinity.tokens
            held = servers.cached_tokens(choice.url, affinity)
        if wait_s is None:
            wait_s = await self.gate.expected_wait_s()
        return WayFacts("tilert", max(0, tokens - held), prefill=choice, wait_s=wait_s)

    async def retry_after_s(self) -> int:
        return await self.gate.retry_after_s()

    async def _affinity(self, request: RoutedRequest) -> Affinity | None:
        return await self._selection.affinity(
            self.server_sets(),
            request.endpoint.wire,
            request.body,
            request.client_headers,
            known=request.affinities,
        )

    async def _token_ids(self, request: RoutedRequest) -> list[int] | None:
        """The chat prompt as token ids, if some prefill server of the model is proven to
        render it as the gateway does; None: it goes as text."""
        if self._prompt_ids is None or self._proof is None or request.endpoint.wire != "chat":
            return None
        proof = self._proof
        proven = [proof.proven(url) for url in self._config.prefill]  # asks them all
        if not any(proven):
            return None
        ids = await self._prompt_ids.ids(request.body)
        if ids is not None and len(ids) >= self._config.max_seq_len:
            return None  # too long: vLLM's own answer to it
        return ids

    def _prompt(self, choice: Choice, ids: list[int] | None, continuable: bool) -> PrefillPrompt:
        """The chat prompt as ids where `choice` is proven to render it as the gateway does;
        `continuable`: else the prefill names the prompt's ids, for a continuation."""
        sent = None
        if self._proof is not None:
            sent = ids if ids is not None and self._proof.proven(choice.url) else None
            kind = "text" if sent is None else "token_ids"
            self._deps.metrics.prefill_input(self._model, kind)
        return PrefillPrompt(token_ids=sent, return_token_ids=continuable and sent is None)

    def _resumer(
        self,
        request: RoutedRequest,
        options: DecodeOptions,
        affinity: Affinity | None,
        prompt_ids: list[int],
        stack: AsyncExitStack,
    ) -> Resume:
        """How this request's output goes on after its node failed mid-stream: on another
        node of the pool, the prompt and the output so far prefilled as ids, with what is
        left of its budget; with no node free in time, on a server of the native path that
        serves whole (not with logprobs); at most `continuations` times."""
        limit, access, metrics = self._config.continuations, request.access, self._deps.metrics
        budget = request.parsed.token_budget

        async def resume(
            failure: DecodeError, output_ids: list[int]
        ) -> tuple[DecodeSource, Prefilled | None] | None:
            reason = failure.code or "decode_failed"
            broken = access.native_decode or access.node or "?"
            access.broken_nodes = ",".join(filter(None, [access.broken_nodes, broken]))

            def ended(outcome: str) -> None:
                metrics.continuation(self._model, reason, outcome)
                log.warning(
                    "request %s: node %s failed mid-stream (%s) after %d tokens: %s",
                    request.request_id,
                    broken,
                    reason,
                    len(output_ids),
                    outcome,
                )

            if reason not in CONTINUABLE:
                ended("not_continuable")
                return None
            if access.continued >= limit:
                ended("limit")
                return None
            left = None if budget is None else budget - len(output_ids)
            ids = [*prompt_ids, *output_ids]
            if (left is not None and left < 1) or len(ids) >= self._config.max_seq_len:
                ended("too_long")
                return None
            with tracing.stage(tracing.CONTINUATION, reason=reason, tokens=len(output_ids)):
                rid = new_request_id()  # the lease names the request its node serves
                try:
                    lease = await self.gate.acquire(
                        priority=request.decision.priority + CONTINUING,
                        wait_s=self._config.continuation_wait_ms / 1000,
                        holder=rid,
                        share=request.share,
                    )
                except GateRejected:
                    # Not on the native path with logprobs: its chunks name them by text,
                    # not by id as a node's lines do.
                    if self._native is None or options.top_logprobs is not None:
                        ended("no_node")
                        return None
                    try:
                        native = await self._continue_natively(
                            request, options, ids, left, rid, stack
                        )
                    except GatewayError as exc:
                        log.warning("request %s: continuing failed: %s", request.request_id, exc)
                        ended("failed")
                        return None
                    access.continued += 1
                    ended("continued_native")
                    return native, None
                servers = await self._prefill_servers(lease)
                choice = servers.pick(request=affinity)
                session, _ = self._session(request, lease, choice, stack)
                prompt = PrefillPrompt(token_ids=ids, rid=rid, budget=left)
                try:
                    prefilled = await self._prefill(
                        session, servers, choice, request, options, affinity, prompt
                    )
                except GatewayError as exc:
                    log.warning("request %s: continuing failed: %s", request.request_id, exc)
                    ended("failed")
                    return None
            access.continued += 1
            access.native_decode = None
            ended("continued")
            return session, prefilled

        return resume

    async def _continue_natively(
        self,
        request: RoutedRequest,
        options: DecodeOptions,
        ids: list[int],
        budget: int | None,
        rid: str,
        stack: AsyncExitStack,
    ) -> NativeDecode:
        """The rest of the output from a server of the native path that serves whole."""
        assert self._native is not None
        sampling = {**options.sampling.for_prefill(), **options.native_options}
        body = vllm.continuation_body(
            request.model,
            ids,
            # Without a budget, what the pool's context leaves, as a node would have had
            # (vLLM's completions default to 16 tokens).
            max_tokens=self._config.max_seq_len - len(ids) if budget is None else budget,
            sampling=sampling,
            stop_token_ids=request.parsed.stop_token_ids,
        )
        path = WIRE_PATHS["completions"]
        reply, choice = await self._native.open_stream(path, body, request_id=rid, stack=stack)
        access = request.access
        access.native_decode = access.upstream = choice.url
        access.upstream_reason = choice.reason
        tracing.annotate(upstream=choice.url)
        return NativeDecode(reply, self._deps.spawn)

    @property
    def token_ids_proof(self) -> TokenIdsProof | None:
        return self._proof

    async def _prefill_servers(self, lease: Lease) -> ServerSet:
        node = lease.node
        servers = self._prefill_of_pool.get(node.pool) or self._prefill_of_release.get(node.tilert)
        if servers is None:
            await lease.release(reports_health=False)
            raise UpstreamError(
                f"no prefill server of TileRT {node.tilert} for node {node.id}",
                status=503,
                code="no_prefill_for_node",
            )
        return servers

    def _session(
        self, request: RoutedRequest, lease: Lease, choice: Choice, stack: AsyncExitStack
    ) -> tuple[NodeSession, asyncio.Event]:
        """A node session on `lease` with the chosen prefill server; the event is set once
        the session has released its slot."""
        access = request.access
        access.node, access.prefill = lease.node.id, choice.url
        access.upstream, access.upstream_reason = choice.url, choice.reason
        released = asyncio.Event()
        held_from = time.monotonic()

        def on_released(session: NodeSession) -> None:
            self._live.discard(session)
            released.set()
            if request.on_node_released is not None:
                request.on_node_released(time.monotonic() - held_from)

        session = NodeSession(
            self._deps, lease, model=self._model, prefill_url=choice.url, on_released=on_released
        )
        self._live.add(session)
        stack.callback(session.close)
        return session, released

    async def _prefill(
        self,
        session: NodeSession,
        servers: ServerSet,
        choice: Choice,
        request: RoutedRequest,
        options: DecodeOptions,
        affinity: Affinity | None,
        prompt: PrefillPrompt,
    ) -> Prefilled:
        """The session's start; how the prefill went is reported to the server's health (an
        error after the prefill is the node's, and the prefill answered)."""
        with servers.hold(choice.url, affinity):
            try:
                prefilled = await session.start(
                    request, options, max_seq_len=self._config.max_seq_len, prompt=prompt
                )
            except PrefillError as exc:
                if (outcome := outcome_of(exc)) is not None:
                    servers.report(choice.url, outcome)
                raise
            except UpstreamError:
                servers.report(choice.url, "ok")
                raise
        servers.report(choice.url, "ok")
        return prefilled

    async def _acquire(self, request: RoutedRequest, started: float) -> Lease:
        decision = request.decision
        if decision.on_saturation == "reject":
            wait_s = 0.0
        else:
            wait_ms = decision.max_queue_wait_ms
            wait_s = (self._default_wait_ms if wait_ms is None else wait_ms) / 1000
        deadline_s, by_deadline = _node_deadline(request, started)
        if by_deadline and deadline_s is not None and deadline_s < wait_s:
            wait_s = deadline_s
        else:
            by_deadline = False
        metrics = self._deps.metrics
        try:
            with tracing.stage(tracing.QUEUE_WAIT, priority=decision.priority):
                lease = await self.gate.acquire(
                    priority=decision.priority,
                    wait_s=wait_s,
                    holder=request.request_id,
                    deadline_s=deadline_s,
                    share=request.share,
                )
                tracing.annotate(node=lease.node.id)
        except GateRejected as exc:
            metrics.queue_wait(self._model, time.monotonic() - started, granted=False)
            if by_deadline and exc.reason in ("wait_timeout", "pool_saturated"):
                raise Overloaded(
                    "no TileRT decode node became free in time to meet the request's"
                    " objective; retry later",
                    retry_after_s=exc.retry_after_s,
                    code=OBJECTIVE_DEADLINE,
                ) from None
            raise Overloaded(
                _REJECTED[exc.reason], retry_after_s=exc.retry_after_s, code=exc.reason
            ) from None
        waited_s = time.monotonic() - started
        metrics.queue_wait(self._model, waited_s, granted=True)
        request.access.queue_wait_ms = round(waited_s * 1e3, 3)
        return lease

    async def _stream(
        self,
        access: AccessRecord,
        session: NodeSession,
        resume: Resume | None,
        relay: DecodeRelay,
        renderer: Renderer,
        prefilled: Prefilled,
        include_usage: bool,
        continuous: bool,
    ) -> AsyncGenerator[bytes, None]:
        # vLLM counts the prompt on the role chunk already, with no completion tokens.
        opening = Usage(prefilled.prompt_tokens, 0, prefilled.cached_tokens) if continuous else None
        first = renderer.start(opening)
        if first:
            yield first
        tail = b""  # the stream's last events, sent with its end in one write
        try:
            async for event in relay.events(session, resume):
                if isinstance(event, RelayEnd):
                    running = _usage(prefilled, event) if continuous else None
                    tail = renderer.finish(
                        event.finish_reason, event.stop_reason, running, relay.take_logprobs()
                    )
                    if include_usage:
                        tail += renderer.usage(_usage(prefilled, event))
                    continue
                running = None
                if continuous:
                    running = Usage(
                        prefilled.prompt_tokens, relay.completion_tokens, prefilled.cached_tokens
                    )
                if chunk := renderer.delta(event, running, relay.take_logprobs()):
                    yield chunk
        except GatewayError as exc:
            self._deps.metrics.upstream_error(self._model, str(exc.code))
            access.ended_with(exc)
            tracing.failed(exc)
            tail = renderer.error(exc)
        except Exception as exc:  # a bug: the client still gets an error event and a clean end
            log.exception("relaying a latency stream failed")
            error = GatewayError("internal error in the gateway")
            access.ended_with(error)
            tracing.failed(exc)
            tail = renderer.error(error)
        yield LastChunk(tail + renderer.end())

    def close_all(self) -> None:
        """Shutdown: finish the protocol of every session still holding a slot (their
        requests may have been cut off before their own cleanup could start)."""
        for session in list(self._live):
            session.close()


def _planned_prefill(request: RoutedRequest, servers: ServerSet) -> Choice | None:
    """The prefill server a request's objective was predicted for, if the node granted is of
    that server's pool and the server is still healthy after the wait for the node."""
    planned = request.planned
    return servers.still(planned.prediction.facts.prefill if planned is not None else None)


def _node_deadline(request: RoutedRequest, started: float) -> tuple[float | None, bool]:
    """For a request planned for a node by its objective: the seconds left until it must
    have one (from `started`), and whether it leaves the queue then."""
    planned = request.planned
    if planned is None or planned.node_deadline_s is None:
        return None, False
    left = planned.node_deadline_s - (time.monotonic() - started)
    return max(0.0, left), planned.leave_at_deadline


async def _set_within(event: asyncio.Event, limit_s: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), limit_s)
    except TimeoutError:
        return False
    return True


def answer_facts(
    parsed: ChatRequest | CompletionRequest,
    prefilled: Prefilled,
    sampling: Sampling,
    max_seq_len: int,
) -> AnswerFacts:
    """What the answer says beyond the output, as vLLM would: the prefill server's
    fingerprint, and the sampling and length limit the output was generated with."""
    return AnswerFacts(
        system_fingerprint=prefilled.system_fingerprint,
        include_usage=parsed.include_usage,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        # vLLM's own limit when the client set none: what the context leaves.
        max_tokens=parsed.token_budget or max(1, max_seq_len - prefilled.prompt_tokens),
        # A TileRT node is the priority tier; vLLM answers none, so none unless asked.
        service_tier=None if parsed.service_tier is None else LATENCY_SERVICE_TIER,
    )


def _usage(prefilled: Prefilled, end: RelayEnd) -> Usage:
    return Usage(
        prompt_tokens=prefilled.prompt_tokens,
        completion_tokens=end.completion_tokens,
        cached_tokens=prefilled.cached_tokens,
    )
