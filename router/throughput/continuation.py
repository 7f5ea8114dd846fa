"""A native answer whose decode server fails mid-stream goes on on another, unseen.

In `pull` and `push` mode the decode leg of a streamed chat or completions request asks
for each chunk's token ids (`return_token_ids`); `StreamTrack` reads them on the stream's
way to the client (with the prompt's ids, on the first chunk, and what the client has been
shown of each part of the message) and takes them out again, so the client gets the stream
it asked for. When the stream breaks after the first tokens (the server gone, no line
within the decode timeout, a stream ended without its last event), `Continuation` sends
the prompt and the output so far as token ids to another decode server, which serves the
rest whole (`vllm.continuation_body`), and renders its ids through the gateway's text
pipeline and parser, as the latency path renders a node's, on the same client stream.

The seam is invisible: the pipeline first replays the output so far, and `Seam` passes on
only what the client was not shown yet (text the dead server held back, for a stop string
or an unfinished character, is shown then); stop strings are matched by the gateway across
it. Not continued: several choices, logprobs, `echo`, a grammar (`response_format`, a
required or named tool call: vLLM would start it afresh), `include_stop_str_in_output`,
an error event of vLLM's own, and `proxy` mode (the proxy owns the legs).
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import orjson

from router.errors import DecodeError, GatewayError, UpstreamError
from router.openai.endpoints import WIRE_PATHS
from router.openai.render import AnswerFacts, AnswerHead, Renderer, Usage
from router.parsers import ParsedDelta, ToolCallDelta, finish_reason
from router.serving import RoutedRequest, new_request_id
from router.serving.output import output_pipeline
from router.telemetry import tracing
from router.telemetry.metrics import Metrics
from router.throughput.whole import WholeServing
from router.tokens.tokenizer import LoadedTokenizer
from router.upstream import Reply, Upstreams, vllm
from router.upstream.native_decode import NativeDecode, Spawn
from router.upstream.sse_events import EVENT_END, EventCutter
from router.upstream.tilert import DoneLine

log = logging.getLogger("pd_gateway.throughput")

MAX_TRACKED_EVENT_BYTES = 8 << 20
"""The largest event read whole: the first chunk names the prompt's ids (about 7 bytes a
token). A stream with a larger one is relayed as it comes and not continued."""

SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
)
"""What the client's body says of sampling that the continuing server must be told too."""

_NOT_CONTINUABLE = (
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "echo",
    "include_stop_str_in_output",
    "best_of",
)
"""Asked for any of these, a streamed answer is not continued."""

MAX_UNREAD_BYTES = 256 << 10
"""Events passed on but not yet read, at most, per stream: a stream's first thousand or so
chunks are read only if it fails; a longer one's in batches of this size."""

_FINISH_MARK = b'"finish_reason":"'
_HELD_BACK_MARK = b'"delta":{},'
_DONE_EVENT = b"data: [DONE]"
_LATER_DONE_EVENT = EVENT_END + _DONE_EVENT

TOO_LONG = "too_long"
"""The prompt and the output so far fill the model's context: nothing is left to go on."""

_IDS_KEY = b'token_ids":['
_ID_LIST = re.compile(rb'token_ids":\[[^\]]*\]')
_NO_IDS = b'token_ids":null'  # a literal: no template to expand per match
_DATA = b"data:"
_DONE = b"[DONE]"


def continuable(request: RoutedRequest) -> bool:
    """Whether a streamed answer of `request` can go on from its ids on another server."""
    parsed, body = request.parsed, request.body
    if not parsed.stream or request.endpoint.name not in ("chat", "completions") or parsed.n != 1:
        return False
    if any(body.get(key) not in (None, False) for key in _NOT_CONTINUABLE):
        return False
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        return False
    return body.get("tool_choice") in (None, "auto", "none")


def with_token_ids(body: dict[str, Any]) -> dict[str, Any]:
    """`body` asking for its chunks' token ids (a copy)."""
    return {**body, "return_token_ids": True}


@dataclass(slots=True)
class Shown:
    """What the client's stream has shown of each part of the message."""

    content: int = 0  # characters (a completions answer's text too)
    reasoning: int = 0
    calls: dict[int, int] = field(default_factory=dict)
    """Each tool call whose head (id, name) was shown, by index: its argument characters."""


class StreamTrack:
    """Reads a native decode stream on its way to the client (a `ChunkFilter`): the prompt's
    ids, the output's ids, what the client was shown, and the answer's id. Whole events are
    passed on with the ids taken out (`keep_ids`: the client asked for them); an event whose
    end never comes is not passed on (the stream broke inside it).

    What only a failure needs is read when asked for (or once `MAX_UNREAD_BYTES` of events
    wait): while nothing fails, a chunk costs a few scans of its bytes, not a parse of each
    of its events."""

    def __init__(self, *, keep_ids: bool, max_pending: int = MAX_TRACKED_EVENT_BYTES) -> None:
        self._prompt_ids: list[int] | None = None
        self._output_ids: list[int] = []
        self._shown = Shown()
        self._response_id: str | None = None
        self._created = 0
        self._lost: str | None = None
        self.finished = False  # a finish reason was seen: the output is whole
        self.done = False  # [DONE] was seen
        self._keep_ids = keep_ids
        self._events = EventCutter(max_pending)
        self._unread: list[bytes] = []  # whole events passed on, not yet read
        self._unread_bytes = 0

    def feed(self, chunk: bytes) -> bytes:
        if self._events.idle and chunk.endswith(EVENT_END):  # whole events: most chunks
            return self._passed(chunk)
        out: list[bytes] = []
        for whole, data in self._events.feed(chunk):
            if whole:
                out.append(self._passed(data))
            else:
                self._lost = "an event too large to read"
                out.append(data)
        return b"".join(out)

    def _passed(self, events: bytes) -> bytes:
        """Whole events as the client gets them."""
        finishing = _FINISH_MARK in events
        if finishing:
            self.finished = True
        if events.startswith(_DONE_EVENT) or _LATER_DONE_EVENT in events:
            self.done = True
        if (
            _HELD_BACK_MARK in events
            and not self._keep_ids
            and not (finishing and events.find(EVENT_END) == len(events) - len(EVENT_END))
        ):
            # A chunk sent for its ids alone (a parser held the step's text back) is left
            # out: read now, in order, to know which. (A finishing event alone in its chunk
            # has an empty delta too, and is passed on.)
            self._read_all()
            out: list[bytes] = []
            for event in events.split(EVENT_END)[:-1]:
                if self._read(event):
                    out += (_without_ids(event), EVENT_END)
            return b"".join(out)
        self._unread.append(events)
        self._unread_bytes += len(events)
        if self._unread_bytes > MAX_UNREAD_BYTES:
            self._read_all()
        return events if self._keep_ids else _without_ids(events)

    def flush(self) -> bytes:
        return b""

    @property
    def prompt_ids(self) -> list[int] | None:
        self._read_all()
        return self._prompt_ids

    @property
    def output_ids(self) -> list[int]:
        self._read_all()
        return self._output_ids

    @property
    def shown(self) -> Shown:
        self._read_all()
        return self._shown

    @property
    def response_id(self) -> str | None:
        self._read_all()
        return self._response_id

    @property
    def created(self) -> int:
        self._read_all()
        return self._created

    @property
    def lost(self) -> str | None:
        """Why the output cannot go on, if it cannot."""
        self._read_all()
        return self._lost

    @property
    def unfinished(self) -> bool:
        """Tokens were shown, the output did not end, and it can go on from its ids."""
        return (
            self.lost is None
            and not self.finished
            and self._prompt_ids is not None
            and bool(self._output_ids)
        )

    def _read_all(self) -> None:
        unread, self._unread, self._unread_bytes = self._unread, [], 0
        for events in unread:
            for event in events.split(EVENT_END)[:-1]:
                self._read(event)

    def _read(self, event: bytes) -> bool:
        """Take what `event` tells; False: it is not for the client (a chunk sent only for
        its ids, where a parser held the step's text back)."""
        if self._lost is not None or not event.startswith(_DATA):
            return True
        try:
            data: Any = orjson.loads(event[len(_DATA) :])
        except orjson.JSONDecodeError:
            if event[len(_DATA) :].strip() == _DONE:
                self.done = True
            else:
                self._lost = "an event that is not JSON"
            return True
        try:
            choices = data["choices"]
            choice = choices[0] if choices else None
        except (KeyError, TypeError):
            self._lost = "an error event" if "error" in data else "an event that is not a chunk"
            return True
        if self._response_id is None:
            self._first(data)
        if choice is None:
            return True  # the usage chunk
        if len(choices) != 1 or type(choice) is not dict or choice.get("index", 0) != 0:
            self._lost = "several choices"
            return True
        ids = choice.get("token_ids")
        if type(ids) is list:
            self._output_ids += ids
        if choice.get("finish_reason") is not None:
            self.finished = True
            return True
        delta = choice.get("delta")
        if type(delta) is dict:
            if not delta and choice.get("logprobs") is None:
                return False
            if type(content := delta.get("content")) is str and len(delta) <= 2:
                self._shown.content += len(content)  # the most of a stream's chunks
            else:
                self._shown_of(delta)
        elif type(text := choice.get("text")) is str:
            self._shown.content += len(text)
        return True

    def _first(self, data: dict[str, Any]) -> None:
        """The answer's id and time, and the prompt's ids, from its first chunk."""
        answer_id, created = data.get("id"), data.get("created")
        if isinstance(answer_id, str):
            self._response_id = answer_id
            self._created = created if isinstance(created, int) else 0
        prompt = data.get("prompt_token_ids")
        if not isinstance(prompt, list):  # a completions stream names them on its choice
            choices = data.get("choices")
            choice = choices[0] if isinstance(choices, list) and choices else None
            prompt = choice.get("prompt_token_ids") if isinstance(choice, dict) else None
        if isinstance(prompt, list) and all(type(i) is int for i in prompt):
            self._prompt_ids = prompt

    def _shown_of(self, delta: dict[str, Any]) -> None:
        shown = self._shown
        if "role" in delta:
            return  # the opening chunk
        if isinstance(content := delta.get("content"), str):
            shown.content += len(content)
        reasoning = delta.get("reasoning") or delta.get("reasoning_content")
        if isinstance(reasoning, str):
            shown.reasoning += len(reasoning)
        for call in delta.get("tool_calls") or ():
            if not isinstance(call, dict) or not isinstance(index := call.get("index"), int):
                continue
            function = call.get("function")
            arguments = function.get("arguments") if isinstance(function, dict) else None
            shown.calls[index] = shown.calls.get(index, 0) + (
                len(arguments) if isinstance(arguments, str) else 0
            )


class Seam:
    """Passes on of the continued message's deltas only what the client was not shown."""

    def __init__(self, shown: Shown) -> None:
        self._content = shown.content
        self._reasoning = shown.reasoning
        self._calls = dict(shown.calls)  # index -> argument characters still to skip

    def unseen(self, delta: ParsedDelta) -> ParsedDelta:
        out = ParsedDelta()
        out.content, self._content = _skip(delta.content, self._content)
        out.reasoning, self._reasoning = _skip(delta.reasoning, self._reasoning)
        for call in delta.tool_calls:
            skip = self._calls.get(call.index)
            if skip is None:
                out.tool_calls.append(call)
                continue
            arguments, self._calls[call.index] = _skip(call.arguments, skip)
            if arguments:  # its head was shown: the rest of its arguments alone
                out.tool_calls.append(ToolCallDelta(call.index, arguments=arguments))
        return out


def _without_ids(events: bytes) -> bytes:
    """`events` with each list of ids (`token_ids`, `prompt_token_ids`) made `null`. Inside a
    JSON string a quote is escaped, so `token_ids":[` is always a key and its list."""
    return _ID_LIST.sub(_NO_IDS, events) if _IDS_KEY in events else events


def _skip(text: str, skip: int) -> tuple[str, int]:
    """`text` less its first `skip` characters, and what is left to skip after it."""
    if skip <= 0:
        return text, 0
    return text[skip:], max(0, skip - len(text))


@dataclass(frozen=True, slots=True)
class Continuing:
    """What a model's native path continues a broken stream with."""

    model: str
    tokenizer: LoadedTokenizer
    output_parser: str
    limit: int
    """Continuations per answer (`continuations` of the model's `throughput`)."""
    upstreams: Upstreams
    metrics: Metrics | None
    spawn: Spawn


class Continuation:
    """One answer's way on after its decode server broke: another decode server of the set,
    told the prompt and the output so far as ids; at most `Continuing.limit` times."""

    def __init__(
        self,
        continuing: Continuing,
        request: RoutedRequest,
        track: StreamTrack,
        whole: WholeServing,
        stack: AsyncExitStack,
    ) -> None:
        self._continuing = continuing
        self._request = request
        self.track = track
        self._whole = whole
        self._stack = stack
        self.cached_tokens: int | None = None
        """The prompt's cache hits, as the answer's usage reports them (the prefill's)."""
        self._details_reported = True
        """Whether the decode servers report `prompt_tokens_details` (vLLM's
        `--enable-prompt-tokens-details`), as the usage of the rest says."""
        self._max_model_len: dict[str, int] = {}

    def can_go_on(self) -> bool:
        return self.track.unfinished and self._continuing.limit > 0

    async def rest(self, reason: str) -> AsyncIterator[bytes]:
        """The rest of the client's stream, its end (`[DONE]`) included. Raises GatewayError
        if it cannot go on: the client's stream then ends with the error."""
        continuing, request, track = self._continuing, self._request, self.track
        assert track.prompt_ids is not None
        prompt_ids, access = track.prompt_ids, request.access
        parsed = request.parsed
        pipeline = output_pipeline(request, continuing.tokenizer, continuing.output_parser)
        seam = Seam(track.shown)
        renderer = self._renderer()

        def running() -> Usage | None:
            """The count so far, on every chunk (`continuous_usage_stats`)."""
            if not parsed.continuous_usage:
                return None
            cached = self.cached_tokens if self._details_reported else None
            return Usage(len(prompt_ids), pipeline.completion_tokens, cached)

        output_ids = list(track.output_ids)
        step = pipeline.feed(output_ids)  # the output so far, as the gateway renders it
        if chunk := renderer.delta(seam.unseen(step.delta), running()):
            yield chunk
        finish, stopped = "length", step.stopped
        budget = parsed.token_budget
        while not stopped:
            left = None if budget is None else budget - len(output_ids)
            if left is not None and left < 1:
                break  # the budget was spent: the server broke before its finish
            source = await self._open(reason, [*prompt_ids, *output_ids], left)
            try:
                while (line := await source.next_line()) is not None:
                    if isinstance(line, DoneLine):
                        finish = line.finish_reason
                        continue
                    output_ids += line.ids
                    step = pipeline.feed(line.ids)
                    if chunk := renderer.delta(seam.unseen(step.delta), running()):
                        yield chunk
                    stopped = step.stopped
                    if stopped:
                        break
            except DecodeError as exc:
                reason = exc.code or "decode_failed"  # and on on another, if still allowed
                continue
            finally:
                source.close(stopped=stopped)
                if source.usage is not None:
                    self._details_reported = "prompt_tokens_details" in source.usage
            break
        tail = pipeline.finish()
        if chunk := renderer.delta(seam.unseen(tail), running()):
            yield chunk
        if not pipeline.stopped and finish == "stop":
            pipeline.count_suppressed_eos()
        ended = finish_reason(
            pipeline.parser.message(),
            ended_by_length=not pipeline.stopped and finish == "length",
            tool_choice=parsed.requested_tool_choice,
        )
        cached = self.cached_tokens if self._details_reported else None
        usage = Usage(len(prompt_ids), max(pipeline.completion_tokens, 1), cached)
        access.finish_reason, access.completion_tokens = ended, usage.completion_tokens
        access.prompt_tokens = usage.prompt_tokens
        tail_events = renderer.finish(ended, pipeline.stop_reason, running())
        if parsed.include_usage:
            tail_events += renderer.usage(usage)
        yield tail_events + renderer.end()

    async def _open(self, reason: str, ids: list[int], left: int | None) -> NativeDecode:
        """The rest from another decode server; raises GatewayError if there is none to
        go on on (the reason counted)."""
        continuing, request, access = self._continuing, self._request, self._request.access
        broken = access.upstream or "?"
        access.broken_servers = _listed(access.broken_servers, broken)

        def ended(outcome: str) -> None:
            if continuing.metrics is not None:
                continuing.metrics.continuation(continuing.model, reason, outcome)
            log.warning(
                "request %s: decode server %s failed mid-stream (%s) after %d tokens: %s",
                request.request_id,
                broken,
                reason,
                len(self.track.output_ids),
                outcome,
            )

        if access.continued >= continuing.limit:
            ended("limit")
            raise UpstreamError(
                f"the decode server failed mid-stream ({reason}) and the answer was continued"
                f" {access.continued} times already",
                status=502,
                code=reason,
            )
        with tracing.stage(tracing.CONTINUATION, reason=reason, tokens=len(ids)):
            try:
                choice = self._whole.pick(exclude=[broken])
                if left is None:
                    left = await self._context_left(choice.url, len(ids))
                body = vllm.continuation_body(
                    request.model,
                    ids,
                    max_tokens=left,
                    sampling=native_sampling(request.body, len(self.track.output_ids)),
                    stop_token_ids=request.parsed.stop_token_ids,
                )
                # Its usage says whether the servers report the prompt's cache hits.
                body["stream_options"] = {"include_usage": True}
                reply, chosen = await self._whole.open_stream(
                    WIRE_PATHS["completions"],
                    body,
                    request_id=new_request_id(),
                    stack=self._stack,
                    first=choice,
                )
            except GatewayError as exc:
                ended(TOO_LONG if exc.code == TOO_LONG else "failed")
                raise
        access.continued += 1
        access.upstream, access.upstream_reason = chosen.url, chosen.reason
        ended("continued_native")
        return NativeDecode(reply, continuing.spawn)

    async def _context_left(self, url: str, tokens: int) -> int:
        """What the model's context leaves after `tokens` (vLLM's own limit for an answer
        whose client named none), from the model list of the server at `url` (one of the
        set: its servers serve one model alike)."""
        length = self._max_model_len.get(url)
        if length is None:
            reply: Reply = await self._continuing.upstreams.call(
                vllm.MODELS, "GET", url, "/v1/models", read_s=5.0
            )
            length = _max_model_len(await reply.json() if reply.status == 200 else None)
            if length is None:
                raise UpstreamError(
                    f"{url} names no max_model_len: the rest of the answer has no budget",
                    status=502,
                    code="continuation_failed",
                )
            self._max_model_len[url] = length
        if tokens >= length:
            raise UpstreamError(
                "the prompt and the output so far fill the model's context",
                status=502,
                code=TOO_LONG,
            )
        return length - tokens

    def _renderer(self) -> Renderer:
        request, track = self._request, self.track
        head = AnswerHead(
            track.response_id or "",
            track.created,
            request.model,
            request.client_body or {},
            AnswerFacts(include_usage=request.parsed.include_usage),
        )
        return request.endpoint.renderer(head)


def native_sampling(body: Mapping[str, Any], generated: int) -> dict[str, Any]:
    """The client's sampling settings, for the rest of its output (`generated` ids on)."""
    sampling = {key: body[key] for key in SAMPLING_KEYS if body.get(key) is not None}
    min_tokens = body.get("min_tokens")
    if isinstance(min_tokens, int) and min_tokens > generated:
        sampling["min_tokens"] = min_tokens - generated
    return sampling


def _max_model_len(models: Any) -> int | None:
    data = models.get("data") if isinstance(models, dict) else None
    for card in data if isinstance(data, list) else ():
        length = card.get("max_model_len") if isinstance(card, dict) else None
        if isinstance(length, int) and length > 0:
            return length
    return None


def _listed(names: str | None, name: str | None) -> str | None:
    return ",".join(filter(None, [names, name]))
