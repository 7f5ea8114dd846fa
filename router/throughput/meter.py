"""What a native answer tells about itself, read on its way through: its time to first
bytes, the time between its stream events, and the usage it reports (prompt and
completion tokens, finish reason), written into the request's access record.

Only events that carry usage or a finish reason are parsed (vLLM sends usage in a stream
only when asked, `stream_options.include_usage`); the others are timed and counted.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from router.serving import RoutedRequest
from router.telemetry.metrics import Metrics

_USAGE_MARK = b'"prompt_tokens"'
_FINISH_MARK = b'"finish_reason":"'
_DATA = b"data: "
_EVENT_END = b"\n\n"


class AnswerMeter:
    def __init__(self, request: RoutedRequest, metrics: Metrics | None) -> None:
        self._request = request
        self._access = request.access
        self._metrics = metrics
        self._last: float | None = None
        self._pending = b""  # an event's start, until its end arrives

    def body(self, content: bytes) -> None:
        """A whole (not streamed) answer."""
        if _USAGE_MARK in content or _FINISH_MARK in content:
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
        elif self._metrics is not None:
            self._metrics.token_gap(self._request.model, "throughput", now - self._last, events)
        self._last = now
        if not self._pending and not _worth_parsing(chunk):
            return
        data = self._pending + chunk
        cut = data.rfind(_EVENT_END)
        if cut < 0:
            self._pending = data
            return
        complete, self._pending = data[:cut], data[cut + len(_EVENT_END) :]
        for event in complete.split(_EVENT_END):
            if event.startswith(_DATA) and _worth_parsing(event):
                self._read_payload(event[len(_DATA) :])

    def _read_payload(self, raw: bytes) -> None:
        try:
            payload: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return
        if not isinstance(payload, dict):
            return
        usage = payload.get("usage")
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(prompt, int):
                self._access.prompt_tokens = prompt
            if isinstance(completion, int):
                self._access.completion_tokens = completion
        choices = payload.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            finish = choices[0].get("finish_reason")
            if isinstance(finish, str):
                self._access.finish_reason = finish


def _worth_parsing(data: bytes) -> bool:
    return _USAGE_MARK in data or _FINISH_MARK in data
