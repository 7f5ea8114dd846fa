"""Request ids as vLLM forms them, and the rid reduction both legs agree on.

See docs/protocols.md §1.2.

vLLM names a chat response ``chatcmpl-<base>`` and a completion ``cmpl-<base>``, where base is
the ``X-Request-Id`` header or a random id. Inside the engine the id carries more suffixes
(completions add the prompt index ``-0``; the engine adds ``-<8 hex>``); the TileRT connector
reduces the engine id and the router reduces the response id with the same three steps.
"""

from __future__ import annotations

import re
import secrets
import uuid
from typing import Literal

Endpoint = Literal["chat", "completions"]

_PREFIXES = ("chatcmpl-", "cmpl-")
_HEX_TAIL = re.compile(r"[0-9a-f]{1,8}")
_DIGIT_TAIL = re.compile(r"[0-9]{1,3}")


def random_base() -> str:
    """A random request id as vLLM makes one (uuid4 hex, no dashes)."""
    return uuid.uuid4().hex


def response_id(endpoint: Endpoint, base: str) -> str:
    """The ``id`` of the response body: ``chatcmpl-<base>`` or ``cmpl-<base>``."""
    return f"chatcmpl-{base}" if endpoint == "chat" else f"cmpl-{base}"


def engine_request_id(endpoint: Endpoint, base: str, suffix: str | None = None) -> str:
    """The id the engine (and so the KV connector) sees for a request."""
    suffix = suffix or secrets.token_hex(4)
    if endpoint == "chat":
        return f"chatcmpl-{base}-{suffix}"
    return f"cmpl-{base}-0-{suffix}"


def _strip_tail(value: str, pattern: re.Pattern[str]) -> str:
    head, dash, tail = value.rpartition("-")
    if dash and pattern.fullmatch(tail):
        return head
    return value


def reduce_rid(request_id: str) -> str:
    """Apply the three-step reduction of docs/protocols.md §1.2 to a response or engine id."""
    for prefix in _PREFIXES:
        if request_id.startswith(prefix):
            request_id = request_id[len(prefix) :]
            break
    request_id = _strip_tail(request_id, _HEX_TAIL)
    return _strip_tail(request_id, _DIGIT_TAIL)
