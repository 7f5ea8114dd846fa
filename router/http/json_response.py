"""JSON responses rendered with orjson, and OpenAI error responses."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import Response

from router.errors import GatewayError, error_json


def json_response(
    payload: Any, *, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        orjson.dumps(payload), status_code=status, media_type="application/json", headers=headers
    )


def error_response(error: GatewayError, *, headers: dict[str, str] | None = None) -> Response:
    return Response(
        error_json(error),
        status_code=error.status,
        media_type="application/json",
        headers={**(headers or {}), **error.headers},
    )
