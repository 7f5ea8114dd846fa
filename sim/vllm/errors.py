"""OpenAI-style error bodies as vLLM sends them: ``{"error": {message, type, param, code}}``."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any


class ApiError(Exception):
    """A request that ends with an OpenAI error body and an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        return error_body(self.status, self.message, self.param)


def error_type(status: int) -> str:
    """vLLM's error type name for a status, e.g. 400 → ``BadRequestError``."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        return "Error"
    name = phrase.title().replace(" ", "").replace("-", "")
    return name if name.endswith("Error") else name + "Error"


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The OpenAI error object for ``status``."""
    return {
        "error": {"message": message, "type": error_type(status), "param": param, "code": status}
    }
