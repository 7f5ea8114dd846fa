"""The gateway's exceptions, and the one function that renders them as OpenAI errors.

    GatewayError                   -> rendered with its own status and OpenAI error type
     ├── InvalidRequest            400 invalid_request_error   (nothing sent upstream)
     ├── AuthenticationFailed      401 authentication_error
     ├── NotFound / ModelNotFound  404 (an admin object / model_not_found)
     ├── Overloaded                429 (with Retry-After)      (the gate shed the request)
     ├── Unavailable               503 (the gateway is shutting down)
     ├── ClientGone                499 (never read: the client left before the answer)
     └── UpstreamError             502/503/504, or an upstream 4xx passed through
          ├── PrefillError         the vLLM prefill failed
          └── DecodeError          the TileRT node failed before anything reached the client
               └── NodeRefused     the node refused the request itself (400 about the request,
                                   or a feature its engine lacks): not a node failure

Third-party exceptions are translated into these at the boundary where they occur (httpx in
`router.upstream`, pydantic in `router.openai.requests`), so nothing above ever sees them.
"""

from __future__ import annotations

from typing import Any

import orjson


class GatewayError(Exception):
    status: int = 500
    error_type: str = "internal_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequest(GatewayError):
    status = 400
    error_type = "invalid_request_error"


class AuthenticationFailed(GatewayError):
    status = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class NotFound(GatewayError):
    status = 404
    error_type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(GatewayError):
    status = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class Overloaded(GatewayError):
    """The TileRT pool could not take the request in time (queue full or wait budget spent)."""

    status = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: int, code: str) -> None:
        super().__init__(message, code=code, headers={"Retry-After": str(retry_after_s)})
        self.retry_after_s = retry_after_s


class Unavailable(GatewayError):
    """The gateway itself cannot serve now (it is shutting down)."""

    status = 503
    error_type = "service_unavailable"


class ClientGone(GatewayError):
    """The client left before its answer started; nobody reads this (nginx's 499)."""

    status = 499
    error_type = "client_closed_request"


class UpstreamError(GatewayError):
    """`in_doubt`: the upstream may have acted on the request all the same (it timed out or
    broke off after the request was sent, or answered 200 with something unusable)."""

    status = 502
    error_type = "upstream_error"

    def __init__(
        self,
        message: str,
        *,
        in_doubt: bool = False,
        passthrough: bytes | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)
        self.in_doubt = in_doubt
        self.passthrough = passthrough
        """The upstream's own OpenAI-shaped error body, sent to the client as it came."""


class PrefillError(UpstreamError):
    pass


class DecodeError(UpstreamError):
    pass


class NodeRefused(DecodeError):
    """A TileRT 0.1.6 node's typed refusal (docs/protocols.md §1.6): an answer about the
    request, never held against the node. `unsupported`: the node's engine lacks a feature
    the request uses (`code` names it); another path may serve the request. Otherwise the
    request itself is invalid there (a bad parameter or grammar): the client's 400."""

    def __init__(self, message: str, *, code: str, unsupported: bool) -> None:
        super().__init__(message, status=400, code=code)
        self.unsupported = unsupported
        self.error_type = "invalid_request_error"


def error_json(error: GatewayError) -> bytes:
    passthrough = getattr(error, "passthrough", None)
    return passthrough if passthrough is not None else orjson.dumps(error.body())
