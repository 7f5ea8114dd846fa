"""One request's node protocol on the latency path, from its held slot to the slot's release.

    lease → prefill (vLLM pushes the KV state to the node) → open /pd/decode → lines
          → always: consume a claimed transfer, or cancel and drain an open decode
          → release the slot, with the verdict on the node's health

Upstream steps run in their own task, so a client who leaves mid-step cannot interrupt the
protocol halfway: `close` then finishes what the protocol requires in the background (a
claimed transfer is consumed by one /pd/decode; an open decode is cancelled and read to its
end so the node frees its lock) and only then releases the slot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from router.errors import DecodeError, NodeRefused, PrefillError
from router.gate import Lease, NodeFailure, failure_for
from router.latency.sampling import DecodeOptions
from router.node_lifecycle.facts import NodeFactsBook
from router.serving import RoutedRequest
from router.telemetry import tracing
from router.telemetry.metrics import Metrics
from router.upstream import Upstreams, tilert, vllm
from router.upstream.tilert import DecodeStream, NodeLine
from router.upstream.timeouts import Timeouts
from router.upstream.vllm import Prefilled

# How long a 429 from a node we hold may last before it counts as the node being taken.
BUSY_GRACE_S = 1.0

CONTINUABLE = frozenset({"decode_truncated", "decode_stalled", "decode_failed", "decode_bad_line"})
"""Failures of a node's stream after which the output can go on from another node: the
node died, stalled, failed or sent garbage (not: a lease lost with the gate's state)."""

Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]


@dataclass(frozen=True, slots=True)
class PrefillPrompt:
    """What a session's prefill sends in place of the client's prompt (nothing by default).

    A continuation sends the prompt and the output so far as token ids under a request id of
    its own, with what is left of the output's budget."""

    token_ids: list[int] | None = None
    """The prompt as ids: a chat prompt the gateway rendered and encoded, or a prompt and
    part of its output."""
    return_token_ids: bool = False
    """Ask the prefill server for the prompt's ids (to continue the output elsewhere)."""
    rid: str | None = None
    """The request id both legs name (dash-free); the request's own by default."""
    budget: int | None = None
    """The output's budget in tokens; the request's own by default."""


@dataclass(frozen=True, slots=True)
class LatencyDeps:
    """What every latency request needs from the application."""

    upstreams: Upstreams
    timeouts: Timeouts
    spawn: Spawn
    """Runs a cleanup in the background; shutdown waits for it."""
    metrics: Metrics
    facts: NodeFactsBook
    """What each node reported about itself; typed refusals correct it."""


class NodeSession:
    """The protocol for one request on one leased node. `close()` it on every path."""

    def __init__(
        self,
        deps: LatencyDeps,
        lease: Lease,
        *,
        model: str,
        prefill_url: str,
        on_released: Callable[[NodeSession], None],
    ) -> None:
        self._deps = deps
        self._lease = lease
        self._model = model
        self._prefill_url = prefill_url
        self._on_released = on_released
        self._rid = ""
        self._prefilled: Prefilled | None = None
        self._stream: DecodeStream | None = None
        self._unadmitted: asyncio.Task[DecodeStream] | None = None
        """A decode still waiting for a transfer the node did not receive in time."""
        self._start_task: asyncio.Task[Prefilled] | None = None
        self._closing: asyncio.Task[None] | None = None
        self._abandoned = False
        self._node_error: str | None = None  # what the node did wrong, for its health
        self._cancel_reason = "client_gone"

    async def start(
        self,
        request: RoutedRequest,
        options: DecodeOptions,
        *,
        max_seq_len: int,
        prompt: PrefillPrompt | None = None,
    ) -> Prefilled:
        """Prefill, then open the node's decode stream. Raises GatewayError before any output;
        the slot is then released (in the background if the protocol needs finishing).
        `prompt`: what the prefill sends instead of the client's prompt, and how."""
        prompt = prompt or PrefillPrompt()
        # Dash-free: vLLM and the node reduce it to itself.
        self._rid = prompt.rid or request.request_id
        self._start_task = asyncio.create_task(self._start(request, options, max_seq_len, prompt))
        try:
            return await asyncio.shield(self._start_task)
        except BaseException:
            self.close()
            raise

    async def _start(
        self,
        request: RoutedRequest,
        options: DecodeOptions,
        max_seq_len: int,
        prompt: PrefillPrompt,
    ) -> Prefilled:
        deps, node = self._deps, self._lease.node
        if not self._lease.valid():  # the prefill names the node: only while it is ours
            raise _lease_lost()
        body = vllm.prefill_body(
            request.body,
            vllm.tilert_params(node),
            first_token_of=request.endpoint.wire,
            top_logprobs=options.top_logprobs or 1,
            sampling=options.sampling.for_prefill(),
            prompt_token_ids=prompt.token_ids,
            return_token_ids=prompt.return_token_ids,
        )
        started = time.monotonic()
        with tracing.stage(tracing.PREFILL, upstream=self._prefill_url, node=node.id):
            data = await vllm.prefill(
                deps.upstreams,
                self._prefill_url,
                request.endpoint.wire_path,
                body,
                request_id=self._rid,
            )
        # Parsed only after the 200: an unusable answer still claimed the transfer.
        prefilled = self._prefilled = vllm.parse_prefilled(data, request.endpoint.wire)
        computed = prefilled.prompt_tokens - (prefilled.cached_tokens or 0)
        request.access.prefilled(time.monotonic() - started, computed)
        if self._abandoned:
            return prefilled
        budget = request.parsed.token_budget if prompt.budget is None else prompt.budget
        body = tilert.decode_body(
            rid=self._rid,
            first_token_id=prefilled.first_token_id,
            max_tokens=_node_max_tokens(prefilled, budget, max_seq_len),
            sampling=options.node_sampling,
            timeout_s=deps.timeouts.kv_transfer_s,
            top_logprobs=options.top_logprobs,
            grammar_spec=options.grammar_spec,
        )
        stall_s = deps.timeouts.decode_stall_s
        if not await self._lease.renew():  # never start a decode on a node no longer ours
            raise _lease_lost()
        with tracing.stage(tracing.KV_TRANSFER, node=node.id, upstream=node.url):
            self._stream = await self._open_decode_retrying(body, stall_s)
        self._lease.transfer_landed()  # the node answered only once the transfer was in
        return prefilled

    async def _open_decode_retrying(self, body: dict[str, Any], stall_s: float) -> DecodeStream:
        try:
            return await self._open_decode(body, stall_s)
        except DecodeError as exc:
            # The node we hold may answer its previous response's last bytes a moment before
            # it frees its lock: a 429 then is a race, not a node taken by someone else.
            if exc.code != "node_busy" or self._abandoned or self._unadmitted is not None:
                raise
            node = self._lease.node
            if not await tilert.wait_idle(self._deps.upstreams, node, limit_s=BUSY_GRACE_S):
                raise
            if not self._lease.valid():
                raise _lease_lost() from exc
            return await self._open_decode(body, stall_s)

    async def _open_decode(self, body: dict[str, Any], stall_s: float) -> DecodeStream:
        """The node's decode stream, once its transfer has arrived. A node whose answer has
        not come within `kv_admission_s` either waits for a transfer it refused (its receive
        slot is taken; neither release says so to the gateway, but /decode_status shows
        the decode waiting): `node_busy`; or it never took the call up: `decode_timeout`,
        in doubt. Either way the decode is finished when the session closes."""
        deps, node = self._deps, self._lease.node
        opening = asyncio.ensure_future(
            tilert.open_decode(deps.upstreams, node, body, stall_s=stall_s)
        )
        try:
            done, _ = await asyncio.wait([opening], timeout=deps.timeouts.kv_admission_s)
        except BaseException:
            opening.cancel()  # as if awaited directly: the session's close finishes the rest
            raise
        if done:
            return opening.result()
        self._unadmitted = opening
        admission_s = deps.timeouts.kv_admission_s
        if await tilert.decoding(deps.upstreams, node, self._rid):
            raise DecodeError(
                f"the TileRT decode node did not receive the KV transfer within "
                f"{admission_s:g} s: its receive slot is taken",
                status=503,
                code="node_busy",
            )
        message = f"did not answer its decode call within {admission_s:g} s"
        raise tilert.NODE.failure("timeout", message, status=504, in_doubt=True)

    async def next_line(self) -> NodeLine | None:
        """The node's next line; None once its response has ended. Raises DecodeError."""
        assert self._stream is not None, "start() first"
        try:
            if not self._lease.valid():
                raise _lease_lost()
            try:
                return await self._stream.next_line()
            except DecodeError as exc:
                # A replica paused past its lease (stopped, starved) finds the stall timer
                # run out when it resumes: the node did nothing wrong, the lease is gone.
                if not self._lease.valid():
                    raise _lease_lost() from exc
                raise
        except DecodeError as exc:
            self._node_error = exc.code
            self._cancel_reason = "node_error"
            raise

    def close(self, *, stopped: bool = False) -> None:
        """Finish the protocol and release the slot, in the background; idempotent.
        `stopped`: the relay matched a stop (the node is cancelled for that reason)."""
        if self._closing is None:
            if stopped:
                self._cancel_reason = "stop_sequence"
            self._abandoned = True
            self._closing = self._deps.spawn(self._finish_protocol())

    async def _finish_protocol(self) -> None:
        """Whatever happened, leave the node as the protocol requires, then free the slot."""
        failure: NodeFailure | None = None
        reports_health = False  # whether this request says anything about the node's health
        try:
            if self._start_task is not None and not self._start_task.done():
                await asyncio.wait([self._start_task])
            error = self._start_error()
            if self._unadmitted is not None:
                # Out until probed idle and flushed: a transfer may still land (an orphan),
                # and a node that never answered may be running the decode all the same.
                code = error.code if isinstance(error, DecodeError) else None
                reports_health, failure = True, NodeFailure(code or "node_busy", hard=True)
                await self._settle_unadmitted(self._unadmitted)
            elif isinstance(error, NodeRefused):
                # An answer about the request; a 0.1.6 node drained the request's own transfer
                # before giving it. Only a node that then stays busy is judged.
                self._learn_from(error)
                if not await self._idle_again():
                    reports_health, failure = True, NodeFailure("decode_unfinished", hard=True)
            elif self._stream is not None:
                reports_health = True
                failure = failure_for(self._node_error)
                if not await self._end_stream(self._stream):
                    # The node may still hold its lock: out of service until probed idle.
                    failure = NodeFailure("decode_unfinished", hard=True)
            elif isinstance(error, DecodeError):
                reports_health = error.code != "lease_lost"  # the replica's fault, not the node's
                failure = failure_for(error.code)
                if error.code == "decode_timeout" and not await self._cancel():
                    # The /pd/decode may be running unseen and the node did not confirm a
                    # cancel: out of service until probed idle.
                    failure = NodeFailure("decode_unfinished", hard=True)
                elif error.code == "kv_transfer_timeout" and self._lease.node.tilert == "0.1.5":
                    # A 0.1.5 node admits a transfer that arrives after its 504: an orphan
                    # that would break the next request. Out until flushed.
                    failure = NodeFailure("kv_transfer_timeout", hard=True)
                elif error.code == "node_busy":  # our transfer landed; the lock is another's
                    limit_s = self._deps.timeouts.kv_transfer_s
                    if (
                        await tilert.wait_idle(
                            self._deps.upstreams, self._lease.node, limit_s=limit_s
                        )
                        and not await self._consume()
                    ):
                        failure = NodeFailure("decode_unfinished", hard=True)
            elif self._transfer_claimed(error) and not await self._consume():
                reports_health = True
                failure = NodeFailure("decode_unfinished", hard=True)
        finally:
            await self._lease.release(failure, reports_health=reports_health)
            self._on_released(self)
            if self._stream is not None:
                await self._stream.aclose()

    async def _settle_unadmitted(self, opening: asyncio.Task[DecodeStream]) -> None:
        """End a decode still waiting for its transfer: cancelled (0.1.6 answers 499; 0.1.5
        waits on to its 504), and read to its end should the transfer have arrived late."""
        if not opening.done():
            await self._cancel()
            await asyncio.wait([opening])
        if opening.cancelled() or opening.exception() is not None:
            return
        self._stream = opening.result()
        self._cancel_reason = "node_error"
        await self._end_stream(self._stream)

    async def _end_stream(self, stream: DecodeStream) -> bool:
        """Cancel the decode unless it has finished, and read its response to the end."""
        if not stream.done_read:
            self._deps.metrics.cancelled(self._model, self._cancel_reason)
            await self._cancel()
        return await tilert.drain(stream, limit_s=self._deps.timeouts.decode_stall_s)

    def _learn_from(self, refusal: NodeRefused) -> None:
        feature = _FEATURE_REFUSED.get(refusal.code or "")
        if feature is not None:
            self._deps.facts.lacks(self._lease.node.id, feature)

    async def _idle_again(self) -> bool:
        deps = self._deps
        return await tilert.wait_idle(
            deps.upstreams, self._lease.node, limit_s=deps.timeouts.decode_stall_s
        )

    async def _cancel(self) -> bool:
        # Even with the lease lost: the node matches a cancel by rid, so it stops only this
        # request's own decode, never another's.
        return await tilert.cancel(self._deps.upstreams, self._lease.node, self._rid)

    async def _consume(self) -> bool:
        """Consume a claimed transfer with a one-token decode; True once the node is idle
        again (it frees its lock a moment after its answer, so that is waited for too)."""
        prefilled = self._prefilled
        deps, node = self._deps, self._lease.node
        if not self._lease.valid():
            # A decode takes the node's lock, and the node may be another request's by now:
            # once the lease has expired the node is flushed in this request's name instead.
            return False
        await tilert.consume_transfer(
            deps.upstreams,
            node,
            rid=self._rid,
            first_token_id=prefilled.first_token_id if prefilled is not None else 0,
            timeout_s=deps.timeouts.kv_transfer_s,
        )
        return await self._idle_again()

    def _start_error(self) -> BaseException | None:
        task = self._start_task
        if task is None or not task.done() or task.cancelled():
            return None
        return task.exception()

    def _transfer_claimed(self, error: BaseException | None) -> bool:
        """Whether the prefill may have pushed a transfer that no /pd/decode has taken."""
        if isinstance(error, PrefillError):
            return error.in_doubt
        return error is None and self._prefilled is not None


# A typed refusal's error type -> the feature the node showed it lacks.
_FEATURE_REFUSED = {"logprobs_unavailable": "logprobs", "grammar_unsupported": "grammar"}


def _lease_lost() -> DecodeError:
    """The slot's lease ran out unrenewed (the gate's state was unreachable too long): the
    node may be another request's by now; stop, finish the protocol, release."""
    return DecodeError("the TileRT slot's lease was lost", status=503, code="lease_lost")


def _node_max_tokens(prefilled: Prefilled, budget: int | None, max_seq_len: int) -> int:
    if prefilled.finish_reason == "stop":
        return 1  # the first token already ended the output; only consume the transfer
    room = max(1, max_seq_len - prefilled.prompt_tokens)
    return min(budget, room) if budget else room
