"""The decode relay: a node's token lines in, the client's message deltas out.

Ids go through the text pipeline (`router.detokenize`: stop ids, detokenizer, stop strings, then
the family's reasoning and tool-call parser); the relay counts completion tokens as vLLM
does, decides `finish_reason`, records TTFT and the time per token, and fills in the access
record (TTFT, tokens, finish reason), from which the request's duration and token counts
are read at its end.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from router.errors import DecodeError
from router.latency.logprobs import LogprobTrack
from router.openai.render import StopReason, TokenLogprob
from router.parsers import ParsedDelta, ParsedMessage, ToolCallDelta, finish_reason
from router.serving import RoutedRequest
from router.serving.output import output_pipeline
from router.telemetry.metrics import Metrics
from router.tokens.tokenizer import LoadedTokenizer
from router.upstream.tilert import DoneLine, NodeLine, TokenLine
from router.upstream.vllm import Prefilled


class DecodeSource(Protocol):
    """Where an output's ids come from: a node's session (`NodeSession`), or a server of the
    native path going on with an output whose node failed (`NativeDecode`)."""

    async def next_line(self) -> NodeLine | None:
        """The next ids or the done line; None once the output has ended. Raises
        DecodeError."""
        ...

    def close(self, *, stopped: bool = False) -> None:
        """Done with it (`stopped`: the relay matched a stop); idempotent."""
        ...


Resume = Callable[[DecodeError, list[int]], Awaitable[tuple[DecodeSource, Prefilled | None] | None]]
"""Continues an output whose node failed: (the failure, the ids so far) -> the source of
the rest and, if a prefill sampled its first token for a node, that prefill; or None."""


@dataclass(frozen=True, slots=True)
class RelayEnd:
    finish_reason: str
    completion_tokens: int
    stop_reason: StopReason = None


class DecodeRelay:
    def __init__(
        self,
        request: RoutedRequest,
        prefilled: Prefilled,
        *,
        tokenizer: LoadedTokenizer,
        output_parser: str,
        metrics: Metrics,
        started: float,
        top_logprobs: int | None = None,
    ) -> None:
        """`top_logprobs`: logprobs were asked for, with this many candidates per token."""
        parsed = request.parsed
        self._request = request
        self._metrics = metrics
        self._started = started  # monotonic time the request arrived
        self._eos_first = prefilled.finish_reason == "stop"
        self._first_token_id = prefilled.first_token_id
        self._output_ids: list[int] = []  # every id the nodes generated, for a continuation
        self._max_calls = parsed.max_tool_calls
        self._pipeline = output_pipeline(request, tokenizer, output_parser)
        self._logprobs = None
        if top_logprobs is not None:
            self._logprobs = LogprobTrack(
                tokenizer.tokenizer, prefilled, top_logprobs, keep=not parsed.stream
            )

    async def events(
        self, session: DecodeSource, resume: Resume | None = None
    ) -> AsyncIterator[ParsedDelta | RelayEnd]:
        """Message deltas as the node's lines arrive, then one RelayEnd. Raises DecodeError
        if the node fails mid-stream and `resume` does not continue the output elsewhere:
        asked with the failure and the ids generated so far, it gives the source of the
        rest (already started), or None. Ending early (a stop, the client gone) closes the
        session, which cancels the node."""
        pipeline, metrics, model = self._pipeline, self._metrics, self._request.model
        access = self._request.access
        gaps = metrics.stream_gaps(model, "latency")
        node_finish = "stop"
        first_output = True
        tokens_seen = False  # of this session's stream
        last_line = time.monotonic()
        try:
            while True:
                try:
                    line = await session.next_line()
                except DecodeError as exc:
                    if resume is None or not self._output_ids or pipeline.stopped:
                        raise
                    session.close()  # the broken stream's protocol finishes beside
                    resumed = await resume(exc, list(self._output_ids))
                    if resumed is None:
                        raise
                    session, prefilled = resumed
                    tokens_seen, self._eos_first = False, False
                    if prefilled is not None:  # a node's: its prefill sampled the first id
                        self._first_token_id = prefilled.first_token_id
                        self._eos_first = prefilled.finish_reason == "stop"
                        if self._logprobs is not None:
                            self._logprobs.resumed(prefilled)
                    continue
                if line is None:
                    break
                if isinstance(line, DoneLine):
                    node_finish = line.finish_reason
                    if tokens_seen or line.n == 0 or self._eos_first:
                        continue
                    # A node whose budget held only the first token ends with `done` alone
                    # (docs/protocols.md §1.5): that token is still the output's first.
                    line = TokenLine([self._first_token_id])
                now = time.monotonic()
                gaps.line(now - last_line, len(line.ids))
                if tokens_seen:  # the first line's wait is the decode's start, not a gap
                    access.token_gap(now - last_line, len(line.ids))
                tokens_seen = True
                last_line = now
                counted = pipeline.completion_tokens
                if self._eos_first:
                    pipeline.count(line.ids)
                    self._track(line, counted)
                    continue
                self._output_ids += line.ids
                step = pipeline.feed(line.ids)
                self._track(line, counted)
                if self._max_calls is not None and step.delta.tool_calls:
                    step.delta.tool_calls = self._kept(step.delta.tool_calls)
                if step.delta:
                    if first_output:
                        metrics.first_token(model, "latency", now - self._started)
                        self._request.access.ttft_ms = round((now - self._started) * 1e3, 3)
                        first_output = False
                    yield step.delta
                if step.stopped:
                    break
            # The node is done with this request: its slot goes on to the next one now,
            # not after the last chunks have reached this client.
            session.close(stopped=pipeline.stopped)
            tail = pipeline.finish()
            if self._max_calls is not None and tail.tool_calls:
                tail.tool_calls = self._kept(tail.tool_calls)
            if tail:
                yield tail
        finally:
            session.close(stopped=pipeline.stopped)
            gaps.flush()
        if not pipeline.stopped and node_finish == "stop" and not self._eos_first:
            pipeline.count_suppressed_eos()
        finish = finish_reason(
            pipeline.parser.message(),
            ended_by_length=not pipeline.stopped and node_finish == "length",
            tool_choice=self._request.parsed.requested_tool_choice,
        )
        end = RelayEnd(finish, max(pipeline.completion_tokens, 1), pipeline.stop_reason)
        access = self._request.access
        access.finish_reason, access.completion_tokens = end.finish_reason, end.completion_tokens
        yield end

    def _track(self, line: TokenLine, counted_before: int) -> None:
        if self._logprobs is not None:
            self._logprobs.add(line, self._pipeline.completion_tokens - counted_before)

    def take_logprobs(self) -> list[TokenLogprob] | None:
        """Entries for the tokens counted since the last take; None if not asked for."""
        return self._logprobs.take() if self._logprobs is not None else None

    def all_logprobs(self) -> list[TokenLogprob] | None:
        """Every entry, once events() has ended (non-streaming answers)."""
        return self._logprobs.all if self._logprobs is not None else None

    @property
    def completion_tokens(self) -> int:
        """Generated so far."""
        return self._pipeline.completion_tokens

    def message(self) -> ParsedMessage:
        """The whole message, once events() has ended (non-streaming answers)."""
        message = self._pipeline.parser.message()
        if self._max_calls is not None and len(message.tool_calls) > self._max_calls:
            message = dataclasses.replace(message, tool_calls=message.tool_calls[: self._max_calls])
        return message

    def _kept(self, calls: list[ToolCallDelta]) -> list[ToolCallDelta]:
        assert self._max_calls is not None
        return [call for call in calls if call.index < self._max_calls]
