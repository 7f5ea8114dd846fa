"""Server-sent events as OpenAI streams them: one `data: <json>` event per chunk, an error
as one more event once streaming has begun, and `data: [DONE]` at the end."""

from __future__ import annotations

from typing import Any

import orjson

from router.errors import GatewayError, error_json

DONE_EVENT = b"data: [DONE]\n\n"
EVENT_END = b"\n\n"


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + EVENT_END


def error_event(error: GatewayError) -> bytes:
    """An error after the status was sent: one event, then the stream ends cleanly."""
    return b"data: " + error_json(error) + EVENT_END


def sse_failure(error: GatewayError) -> bytes:
    """How a chat or completions stream ends on a failure: the error, then the end marker
    clients wait for."""
    return error_event(error) + DONE_EVENT
