"""What a native answer tells about itself, read on its way through: its time to first
bytes, the time between its stream events, the usage it reports (prompt and completion
tokens: chat and completions' `usage`, the Responses API's `usage` of the response or of
its `response.completed` event), its finish reason and the error it carries (an error
body or a stream's error event), written into the request's access record.

Only events that carry usage, a finish reason or an error are parsed (vLLM sends a chat or
completions stream's usage only when asked, `stream_options.include_usage`); the others
are timed and counted.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from router.serving import RoutedRequest
from router.telemetry.metrics import Metrics

_PROMPT_TOKENS, _INPUT_TOKENS = b'"prompt_tokens"', b'"input_tokens"'
_FINISH, _ERROR = b'"finish_reason":"', b'"error"'
_DATA = b"data: "
_DATA_LINE = b"\n" + _DATA
_EVENT_END = b"\n\n"


class AnswerMeter:
    def __init__(self, request: RoutedRequest, metrics: Metrics | None) -> None:
        self._request = request
        self._access = request.access
        self._metrics = metrics
        self._gaps = metrics.stream_gaps(request.model, "throughput") if metrics else None
        self._last: float | None = None
        self._pending = b""  # an event's start, until its end arrives

    def body(self, content: bytes) -> None:
        """A whole (not streamed) answer."""
        if _worth_parsing(content):
            self._read_payload(content)

    def chunk(self, chunk: bytes) -> None:
        """A stream's chunk as it arrived from the upstream."""
        now = time.monotonic()
        events = chunk.count(_DATA)
        if self._last is None:
            ttft_s = now - self._request.arrived
            self._access.ttft_ms = round(ttft_s * 1e3, 3)
            if self._metrics is not None:
                self._metrics.first_token(self._request.model, "throughput", ttft_s)
        else:
            self._access.token_gap(now - self._last, events)
            if self._gaps is not None:
                self._gaps.line(now - self._last, events)
        self._last = now
        if not self._pending and chunk.endswith(_EVENT_END) and not _worth_parsing(chunk):
            return  # whole events, none with usage, a finish or an error: most chunks
        # An event may be split anywhere, its mark in a later chunk: the unfinished one
        # waits (chunks mostly end on an event's end, so little ever does).
        data = self._pending + chunk if self._pending else chunk
        cut = data.rfind(_EVENT_END)
        if cut < 0:
            self._pending = data
            return
        complete, self._pending = data[:cut], data[cut + len(_EVENT_END) :]
        if not _worth_parsing(complete):
            return
        for event in complete.split(_EVENT_END):
            if _worth_parsing(event) and (payload := _event_data(event)) is not None:
                self._read_payload(payload)

    def close(self) -> None:
        """The stream has ended (however it ended)."""
        if self._gaps is not None:
            self._gaps.flush()

    def _read_payload(self, raw: bytes) -> None:
        try:
            payload: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return
        if not isinstance(payload, dict):
            return
        self._read_error(payload)
        response = payload.get("response")  # a Responses stream's event
        usage = (response if isinstance(response, dict) else payload).get("usage")
        if isinstance(usage, dict):
            prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
            completion = usage.get("completion_tokens", usage.get("output_tokens"))
            if isinstance(prompt, int):
                self._access.prompt_tokens = prompt
            if isinstance(completion, int):
                self._access.completion_tokens = completion
        choices = payload.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            finish = choices[0].get("finish_reason")
            if isinstance(finish, str):
                self._access.finish_reason = finish

    def _read_error(self, payload: dict[str, Any]) -> None:
        """vLLM's error body or stream event, `{"error": {"type", "code", ...}}`, or a
        Responses stream's `{"type": "error", "code", ...}` event."""
        error = payload.get("error")
        if not isinstance(error, dict):
            if payload.get("type") != "error":
                return
            error = payload
        code, kind = error.get("code"), error.get("type")
        if isinstance(code, str) and code:
            self._access.error_code = code
        elif isinstance(kind, str) and kind and kind != "error":
            self._access.error_code = kind
        else:
            self._access.error_code = "error"
        if isinstance(code, int) and 400 <= code < 600:
            self._access.status = code


def _worth_parsing(data: bytes) -> bool:
    # Four scans in C, no generator: this runs for every chunk of every native stream.
    return _FINISH in data or _PROMPT_TOKENS in data or _ERROR in data or _INPUT_TOKENS in data


def _event_data(event: bytes) -> bytes | None:
    """The data of one event (`event: ...` and comment lines may come first)."""
    if event.startswith(_DATA):
        start = len(_DATA)
    elif (at := event.find(_DATA_LINE)) >= 0:
        start = at + len(_DATA_LINE)
    else:
        return None
    end = event.find(b"\n", start)
    return event[start:] if end < 0 else event[start:end]
