"""One request on the latency path, from its held slot to the slot's release.

The session owns the lease. Upstream steps run in their own task so that a client who
leaves mid-step cannot interrupt the protocol halfway: a cleanup then finishes what the
protocol requires (a claimed transfer is consumed by one /pd/decode; an open decode is
cancelled and read to its end so the node frees its lock) and only then releases the slot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import httpx

from router.config import ModelConfig, TimeoutsConfig
from router.errors import DecodeError, GatewayError, PrefillError
from router.gate import Lease, NodeFailure, failure_for
from router.latency import node as node_api
from router.latency.prefill import PrefillResult, prefill_body, run_prefill
from router.metrics import Metrics
from router.openai.requests import ChatRequest, CompletionRequest
from router.parsers import ParsedDelta, ParsedMessage, finish_reason
from router.relay.pipeline import RelayPipeline
from router.tokenizer import LoadedTokenizer

Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]


@dataclass(slots=True)
class SessionEnd:
    finish_reason: str
    completion_tokens: int


class LatencySession:
    def __init__(
        self,
        *,
        metrics: Metrics,
        started: float,
        rid: str,
        on_released: Callable[[LatencySession], None],
        http: httpx.AsyncClient,
        timeouts: TimeoutsConfig,
        spawn: Spawn,
        lease: Lease,
        prefill_url: str,
        model: ModelConfig,
        tokenizer: LoadedTokenizer,
        request: ChatRequest | CompletionRequest,
        body: dict[str, Any],
    ) -> None:
        self.rid = rid
        self._metrics = metrics
        self._started = started  # monotonic time the request arrived at the gate
        self._on_released = on_released
        self._http = http
        self._timeouts = timeouts
        self._spawn = spawn
        self._lease = lease
        self._prefill_url = prefill_url
        self._model = model
        self._request = request
        self._chat = isinstance(request, ChatRequest)
        self._body = body
        self._tokenizer = tokenizer
        self.prefill: PrefillResult | None = None
        self._stream: node_api.DecodeStream | None = None
        self._start_task: asyncio.Task[None] | None = None
        self._closing: asyncio.Task[None] | None = None
        self._abandoned = False
        self._relay: RelayPipeline | None = None
        self._node_error: str | None = None  # what the node did wrong, for its health

    async def start(self) -> None:
        """Prefill, then open the node's decode stream. Raises GatewayError before any output;
        the slot is then released (in the background if the protocol needs finishing)."""
        self._start_task = asyncio.create_task(self._start())
        try:
            await asyncio.shield(self._start_task)
        except BaseException:
            self.close()
            raise

    async def _start(self) -> None:
        node = self._lease.node
        body = prefill_body(self._body, chat=self._chat, node=node)
        self.prefill = await run_prefill(
            self._http,
            self._prefill_url,
            chat=self._chat,
            body=body,
            request_id=self.rid,
            timeout_s=self._timeouts.prefill_s,
        )
        if self._abandoned:
            return
        self._stream = await node_api.open_decode(
            self._http,
            node,
            node_api.decode_body(
                rid=self.rid,
                first_token_id=self.prefill.first_token_id,
                max_tokens=self._node_max_tokens(self.prefill),
                sampling=self._request.sampling,
                timeout_s=self._timeouts.kv_transfer_s,
            ),
            stall_s=self._timeouts.decode_stall_s,
        )

    def _node_max_tokens(self, prefill: PrefillResult) -> int:
        if prefill.finish_reason == "stop":
            return 1  # the first token already ended the output; only consume the transfer
        room = max(1, self._model.latency.max_seq_len - prefill.prompt_tokens)
        budget = self._request.token_budget
        return min(budget, room) if budget else room

    async def events(self) -> AsyncIterator[ParsedDelta | SessionEnd]:
        """Message deltas as the node's lines arrive, then one SessionEnd. Raises DecodeError
        if the node fails mid-stream. Leaving early (client gone) cancels the node."""
        assert self._stream is not None and self.prefill is not None
        request = self._request
        eos_first = self.prefill.finish_reason == "stop"
        node_finish = "stop"
        model = self._model.name
        first_output = True
        last_line = time.monotonic()
        try:
            relay = self._relay = RelayPipeline(
                self._tokenizer.tokenizer,
                vocab=self._tokenizer.vocab,
                parser_name=self._model.output_parser if self._chat else "none",
                tools=_tools(request),
                chat_template_kwargs=request.chat_template_kwargs,
                stop=request.stop_strings,
                stop_token_ids=request.stop_token_ids or [],
            )
            while (line := await self._next_line()) is not None:
                if isinstance(line, node_api.DoneLine):
                    node_finish = line.finish_reason
                    continue
                now = time.monotonic()
                self._metrics.token_gap(model, now - last_line, len(line.ids))
                last_line = now
                if eos_first:
                    relay.completion_tokens += len(line.ids)
                    continue
                step = relay.feed(line.ids)
                if step.delta:
                    if first_output:
                        self._metrics.first_token(model, now - self._started)
                        first_output = False
                    yield step.delta
                if step.stopped:
                    break
            tail = relay.finish()
            if tail:
                yield tail
        finally:
            self.close()
        ended_by_length = not relay.stopped and node_finish == "length"
        if not relay.stopped and node_finish == "stop" and not eos_first:
            relay.completion_tokens += 1  # the EOS the node suppressed: vLLM counts it
        finish = finish_reason(
            relay.parser.message(),
            ended_by_length=ended_by_length,
            tool_choice=getattr(request, "tool_choice", None),
        )
        self._metrics.finished(model, time.monotonic() - self._started, finish)
        yield SessionEnd(finish, max(relay.completion_tokens, 1))

    async def _next_line(self) -> node_api.NodeLine | None:
        assert self._stream is not None
        try:
            return await self._stream.next_line()
        except DecodeError as exc:
            self._node_error = exc.code
            raise

    def record_error(self, error: GatewayError) -> None:
        """An upstream failure after the first byte (it became an error event)."""
        self._metrics.upstream_error(self._model.name, str(error.code))

    def message(self) -> ParsedMessage:
        """The whole message, once events() has ended (non-streaming answers)."""
        assert self._relay is not None
        return self._relay.parser.message()

    def close(self) -> None:
        """Finish the protocol and release the slot, in the background; idempotent."""
        if self._closing is None:
            self._abandoned = True
            self._closing = self._spawn(self._finish_protocol())

    async def _finish_protocol(self) -> None:
        """Whatever happened, leave the node as the protocol requires, then free the slot."""
        failure: NodeFailure | None = None
        judged = False  # whether this request says anything about the node's health
        try:
            if self._start_task is not None and not self._start_task.done():
                await asyncio.wait([self._start_task])
            error = self._start_error()
            node = self._lease.node
            if self._stream is not None:
                judged = True
                failure = failure_for(self._node_error)
                if not await self._end_stream(self._stream):
                    # The node may still hold its lock: out of service until probed idle.
                    failure = NodeFailure("decode_unfinished", hard=True)
            elif isinstance(error, DecodeError):
                judged = True
                failure = failure_for(error.code)
                if error.code == "decode_timeout" and not await self._cancel():
                    # The /pd/decode may be running unseen and the node did not confirm a
                    # cancel: out of service until probed idle.
                    failure = NodeFailure("decode_unfinished", hard=True)
                elif error.code == "node_busy":  # our transfer landed; the lock is another's
                    if await node_api.wait_idle(
                        self._http, node, limit_s=self._timeouts.kv_transfer_s
                    ):
                        await self._consume(self.prefill)
            elif self._transfer_claimed(error):
                await self._consume(self.prefill)
        finally:
            await self._lease.release(failure, judged=judged)
            self._on_released(self)

    async def _end_stream(self, stream: node_api.DecodeStream) -> bool:
        """Cancel the decode unless it has finished, and read its response to the end."""
        if not stream.ended:
            self._metrics.cancelled(self._model.name, self._cancel_reason())
            await self._cancel()
        return await node_api.drain(stream, limit_s=self._timeouts.decode_stall_s)

    async def _cancel(self) -> bool:
        return await node_api.cancel(
            self._http, self._lease.node, self.rid, timeout_s=self._timeouts.cancel_s
        )

    async def _consume(self, prefill: PrefillResult | None) -> None:
        await node_api.consume_transfer(
            self._http,
            self._lease.node,
            rid=self.rid,
            first_token_id=prefill.first_token_id if prefill is not None else 0,
            timeout_s=self._timeouts.kv_transfer_s,
        )

    def _cancel_reason(self) -> str:
        if self._relay is not None and self._relay.stopped:
            return "stop_sequence"
        return "node_error" if self._node_error else "client_gone"

    def _start_error(self) -> BaseException | None:
        task = self._start_task
        if task is None or not task.done() or task.cancelled():
            return None
        return task.exception()

    def _transfer_claimed(self, error: BaseException | None) -> bool:
        """Whether the prefill may have pushed a transfer that no /pd/decode has taken."""
        if isinstance(error, PrefillError):
            return error.claimed
        return error is None and self.prefill is not None


def _tools(request: ChatRequest | CompletionRequest) -> list[dict[str, Any]] | None:
    """The tools the parser may recognise; none when the client forbade calls."""
    if not isinstance(request, ChatRequest) or not request.tools or request.tool_choice == "none":
        return None
    return [tool.model_dump() for tool in request.tools]
