"""Serving a routed request: one interface for every path (`ServePath`), one response type
that runs it and watches the client (`PathResponse`), and spill as a composition
(`Fallback`)."""

from router.serving.base import (
    Answer,
    LastChunk,
    RoutedRequest,
    ServePath,
    error_answer,
    json_answer,
    new_request_id,
    single_chunk,
    whole_answer,
)
from router.serving.fallback import Fallback
from router.serving.response import PathResponse

__all__ = [
    "Answer",
    "Fallback",
    "LastChunk",
    "PathResponse",
    "RoutedRequest",
    "ServePath",
    "error_answer",
    "json_answer",
    "new_request_id",
    "single_chunk",
    "whole_answer",
]
