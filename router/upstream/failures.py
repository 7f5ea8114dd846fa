"""How upstream failures become gateway errors: one translation of transport failures, one
status map, one reader of error bodies.

A `Target` names an upstream as errors and codes show it (`prefill_unreachable`, ...). A
transport failure (`transport.TransportFailure`) is one of three kinds, by how far the
request got:

    unreachable  nothing was sent (refused, no route, connect or pool timeout)   502
    timeout      sent, but the answer did not come in time                       504, in doubt
    broken       sent, then the connection broke off, or the answer broke a      502, in doubt
                 rule of HTTP or a cap (max_header_bytes, max_header_count,
                 max_body_bytes)

"In doubt" means the upstream may have acted on the request: a prefill server may have
pushed a KV transfer, a node may be decoding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

import orjson

from router.errors import UpstreamError
from router.upstream.transport import TransportFailure

FailureKind = Literal["unreachable", "timeout", "broken", "failed"]
"""`failed`: the upstream answered with an error status."""


@dataclass(frozen=True, slots=True)
class Target:
    """An upstream as the errors about it name it."""

    name: str
    """The code prefix: `prefill` gives `prefill_unreachable`, `prefill_timeout`, ..."""
    label: str
    """How messages name it: "the prefill server"."""
    error: type[UpstreamError] = UpstreamError
    codes: Mapping[FailureKind, str] = field(default_factory=lambda: MappingProxyType({}))
    """Codes that differ from `<name>_unreachable`, `_timeout` and `_failed` (both for
    `broken` and `failed`)."""

    def code(self, kind: FailureKind) -> str:
        return self.codes.get(kind) or f"{self.name}_{_CODE_SUFFIX[kind]}"

    def failure(
        self, kind: FailureKind, message: str, *, status: int, in_doubt: bool = False
    ) -> UpstreamError:
        return self.error(
            f"{self.label} {message}", status=status, code=self.code(kind), in_doubt=in_doubt
        )


_CODE_SUFFIX: Mapping[FailureKind, str] = MappingProxyType(
    {"unreachable": "unreachable", "timeout": "timeout", "broken": "failed", "failed": "failed"}
)
_STATUS: Mapping[FailureKind, int] = MappingProxyType(
    {"unreachable": 502, "timeout": 504, "broken": 502}
)
_MESSAGE: Mapping[FailureKind, str] = MappingProxyType(
    {"unreachable": "is unreachable", "timeout": "timed out", "broken": "broke off"}
)


def transport_failure(target: Target, exc: TransportFailure) -> UpstreamError:
    """The one translation of a transport failure into a gateway error."""
    return target.failure(
        exc.kind,
        f"{_MESSAGE[exc.kind]}: {exc}" if str(exc) else _MESSAGE[exc.kind],
        status=_STATUS[exc.kind],
        in_doubt=exc.in_doubt,
    )


def upstream_status(status: int) -> int:
    """The status the client sees for an upstream's error status: a 4xx is the client's own
    request refused and passes through, 503 and 504 keep their meaning (overloaded, timed
    out), any other failure is a bad gateway."""
    return status if 400 <= status < 500 or status in (503, 504) else 502


def status_failure(target: Target, status: int, content: bytes) -> UpstreamError:
    """The error for an upstream that answered with an error status.

    A 4xx is the client's own request refused: when its body is OpenAI's error shape, the
    client gets that body as it came; anything else is wrapped in a message naming the
    upstream."""
    error = target.failure(
        "failed",
        f"answered {status}: {error_message(content)}",
        status=upstream_status(status),
    )
    if 400 <= status < 500 and _openai_shaped(content):
        error.passthrough = content
    return error


BODILESS = frozenset({204, 205, 304})
"""Statuses whose answer has no body: no generation endpoint answers one."""


def bodiless_failure(target: Target, status: int) -> UpstreamError:
    """The error for an upstream whose answer to a generation request has no body."""
    return target.failure(
        "failed",
        f"answered {status}, without a body, to a generation request",
        status=502,
    )


def _openai_shaped(content: bytes) -> bool:
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        return False
    return (
        isinstance(data, dict)
        and isinstance(data.get("error"), dict)
        and isinstance(data["error"].get("message"), str)
    )


def error_message(content: bytes) -> str:
    """The message out of an upstream's OpenAI-style (or vLLM-style) error body."""
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        return "no error message"
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if data.get("message"):
            return str(data["message"])
    return "no error message"
