"""The rest of an answer from a vLLM server that serves whole, read as a node's lines.

When a decode fails mid-stream (a TileRT node with no other node free in time, or a decode
server of the native path), the prompt and the output so far go to a server that serves
whole (`router.throughput.whole`): a completions request of token ids
(`vllm.continuation_body`), streamed with each chunk's `token_ids`. The ids go through the
gateway's text pipeline and parser, as a node's do, so the client's stream goes on in the
shape it started in.

vLLM's ids include the token that ended the output: an EOS (`finish_reason` stop, no
`stop_reason`) is left out here, as a node leaves it out, and the relay counts it; a stop
token id the client asked for is kept, for the relay's pipeline to match as it would a
node's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

import orjson

from router.errors import DecodeError, UpstreamError
from router.upstream.client import Reply
from router.upstream.sse_events import EVENT_END, EventCutter
from router.upstream.tilert import DoneLine, NodeLine, TokenLine

DATA = b"data:"
DONE = b"[DONE]"


Spawn = Callable[[Coroutine[Any, Any, None]], object]
"""Runs a cleanup in the background."""


class NativeDecode:
    """A streamed completions answer as a node's lines. `close` ends the answer at once (the
    server stops generating); the server's hold ends with the request's stack."""

    def __init__(self, reply: Reply, spawn: Spawn) -> None:
        self._reply = reply
        self._spawn = spawn
        self._closed = False
        self._chunks = reply.chunks(by_lines=True)
        self._events = EventCutter()
        self._lines: deque[NodeLine] = deque()
        self._relayed = 0  # ids handed out
        self._finish: str | None = None
        self._ended = False
        self.usage: dict[str, Any] | None = None
        """The answer's usage, once its usage chunk came (if it was asked for)."""

    async def next_line(self) -> NodeLine | None:
        """The next ids, then a done line; None once the answer has ended. Raises
        DecodeError if the server fails, stalls or cuts its stream first."""
        while not self._lines:
            if self._ended:
                return None
            try:
                chunk = await anext(self._chunks, b"")
            except UpstreamError as exc:
                code = "decode_stalled" if exc.code and "timeout" in exc.code else "decode_failed"
                raise DecodeError(f"the native decode failed: {exc.message}", code=code) from None
            if not chunk:
                raise DecodeError(
                    "the native decode's stream ended without its last event",
                    code="decode_truncated",
                )
            for whole, data in self._events.feed(chunk):
                if not whole:
                    raise DecodeError(
                        "the native decode sent an event too large to read",
                        code="decode_bad_line",
                    )
                for event in data.split(EVENT_END):
                    self._take(event)
        return self._lines.popleft()

    def close(self, *, stopped: bool = False) -> None:
        if not self._closed:
            self._closed = True
            self._spawn(self._reply.aclose())

    def _take(self, event: bytes) -> None:
        for line in event.splitlines():
            if not line.startswith(DATA) or self._ended:
                continue
            payload = line[len(DATA) :].strip()
            if payload == DONE:
                if self._finish is None:
                    raise DecodeError(
                        "the native decode ended without a finish reason",
                        code="decode_truncated",
                    )
                self._lines.append(DoneLine(self._relayed, self._finish))
                self._ended = True
                return
            self._chunk(payload)

    def _chunk(self, payload: bytes) -> None:
        try:
            data: Any = orjson.loads(payload)
        except orjson.JSONDecodeError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            message = data["error"].get("message")
            raise DecodeError(f"the native decode failed: {message}", code="decode_failed")
        if isinstance(data, dict) and data.get("choices") == [] and "usage" in data:
            self.usage = data["usage"] if isinstance(data["usage"], dict) else None
            return  # the usage chunk, when asked for (`stream_options.include_usage`)
        try:
            choice = data["choices"][0]
            ids = choice.get("token_ids") or []
            finish, stop_reason = choice.get("finish_reason"), choice.get("stop_reason")
        except (TypeError, KeyError, IndexError, AttributeError):
            choice = None
        if choice is None or not isinstance(ids, list) or not all(type(i) is int for i in ids):
            shown = payload[:200].decode("utf-8", "replace")
            raise DecodeError(f"the native decode sent {shown!r}", code="decode_bad_line")
        if finish == "stop" and stop_reason is None and ids:
            ids = ids[:-1]  # the EOS that ended the output
        if ids:
            self._relayed += len(ids)
            self._lines.append(TokenLine(ids))
        if finish is not None:
            self._finish = finish
