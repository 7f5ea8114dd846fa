"""OpenAI-style error bodies as vLLM sends them: ``{"error": {message, type, param, code}}``.

vLLM names the type after the status (``BadRequestError``, ``NotFoundError``) for errors it
raises itself, and by the bare phrase (``Bad Request``) for request-schema failures.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any


class ApiError(Exception):
    """A request that ends with an OpenAI error body and an HTTP status."""

    def __init__(
        self, status: int, message: str, param: str | None = None, kind: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        return error_body(self.status, self.message, self.param, self.kind)


# vLLM spells these names out rather than deriving them from the running Python's reason
# phrases, which move between releases (Python 3.13 calls 422 "Unprocessable Content").
_VLLM_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    422: "UnprocessableEntityError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}


def error_type(status: int) -> str:
    """vLLM's error type name for a status, e.g. 400 → ``BadRequestError``."""
    if status in _VLLM_ERROR_TYPES:
        return _VLLM_ERROR_TYPES[status]
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        return "Error"
    name = phrase.title().replace(" ", "").replace("-", "")
    return name if name.endswith("Error") else name + "Error"


def schema_error(message: str, param: str | None) -> ApiError:
    """A request body that fails the schema: 400 of type ``Bad Request``."""
    return ApiError(400, message, param, HTTPStatus.BAD_REQUEST.phrase)


def invalid(message: str, param: str | None = None, value: object = None) -> ApiError:
    """A request vLLM refuses on a parameter's value (``BadRequestError``)."""
    if param is not None:
        shown = f"(parameter={param})" if value is None else f"(parameter={param}, value={value})"
        message = f"{message} {shown}"
    return ApiError(400, message, param)


def error_body(
    status: int, message: str, param: str | None = None, kind: str | None = None
) -> dict[str, Any]:
    """The OpenAI error object for ``status``."""
    return {
        "error": {
            "message": message,
            "type": kind or error_type(status),
            "param": param,
            "code": status,
        }
    }


def json_error(exc: Exception) -> ApiError:
    """A body that is not JSON, refused as vLLM's schema check refuses it."""
    position = getattr(exc, "pos", 0)
    message = (
        "1 validation error:\n  {'type': 'json_invalid', 'loc': "
        f"'body.{position}', 'msg': 'JSON decode error'}}"
    )
    return ApiError(400, message, f"body.{position}", HTTPStatus.BAD_REQUEST.phrase)
