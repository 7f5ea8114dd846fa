"""The one status map and error translation of upstream failures."""

from __future__ import annotations

import httpx
import orjson
import pytest

from router.errors import PrefillError, error_json
from router.upstream import status_failure, transport_failure, upstream_status
from router.upstream.httpx_transport import translated
from router.upstream.transport import Broken, TimedOut, TransportFailure, Unreachable
from router.upstream.vllm import PREFILL


@pytest.mark.parametrize(
    ("status", "expected"), [(400, 400), (404, 404), (429, 429), (500, 502), (503, 503), (504, 504)]
)
def test_status_map(status: int, expected: int) -> None:
    assert upstream_status(status) == expected


def test_an_openai_shaped_4xx_reaches_the_client_as_it_came() -> None:
    body = orjson.dumps({"error": {"message": "too long", "type": "BadRequestError", "code": 400}})
    error = status_failure(PREFILL, 400, body)
    assert isinstance(error, PrefillError) and error.status == 400
    assert error_json(error) == body


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, b'{"object": "error", "message": "old vLLM shape"}'),
        (400, b"not json"),
        (500, b'{"error": {"message": "x"}}'),
    ],
)
def test_anything_else_is_wrapped_naming_the_upstream(status: int, body: bytes) -> None:
    error = status_failure(PREFILL, status, body)
    rendered = orjson.loads(error_json(error))["error"]
    assert rendered["message"].startswith(f"the prefill server answered {status}")
    assert rendered["code"] == "prefill_failed"


@pytest.mark.parametrize(
    ("exc", "status", "code", "in_doubt"),
    [
        (Unreachable("refused"), 502, "prefill_unreachable", False),
        (TimedOut("slow"), 504, "prefill_timeout", True),
        (Broken("cut"), 502, "prefill_failed", True),
    ],
)
def test_transport_failures_by_how_far_the_request_got(
    exc: TransportFailure, status: int, code: str, in_doubt: bool
) -> None:
    error = transport_failure(PREFILL, exc)
    assert (error.status, error.code, error.in_doubt) == (status, code, in_doubt)
    assert error.message.endswith(str(exc))  # the transport's own account of it


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (httpx.ConnectError("refused"), "unreachable"),
        (httpx.ConnectTimeout("slow"), "unreachable"),
        (httpx.PoolTimeout("full"), "unreachable"),
        (httpx.LocalProtocolError("bad header"), "unreachable"),
        (httpx.ReadTimeout("slow"), "timeout"),
        (httpx.WriteTimeout("slow"), "timeout"),
        (httpx.RemoteProtocolError("cut"), "broken"),
        (httpx.ReadError("reset"), "broken"),
    ],
)
def test_httpx_failures_in_the_transports_words(exc: httpx.HTTPError, kind: str) -> None:
    assert translated(exc).kind == kind
