"""The endpoint table: every generation endpoint the gateway serves, in one place.

Each entry says what clients call it by (the URL path), how its request is validated, how
the latency path renders its answer, and whether the model's output parser (reasoning and
tool calls) applies. Routes, metrics, upstream calls and the paths all read it from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from policies.types import Endpoint
from router.openai.render import ChatRenderer, CompletionRenderer
from router.openai.requests import ChatRequest, CompletionRequest


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    name: Endpoint
    path: str
    request: type[ChatRequest] | type[CompletionRequest]
    renderer: type[ChatRenderer] | type[CompletionRenderer]
    parses_output: bool
    """Messages out: the model's reasoning and tool-call parser applies."""


ENDPOINTS: Mapping[Endpoint, EndpointSpec] = MappingProxyType(
    {
        "chat": EndpointSpec(
            "chat", "/v1/chat/completions", ChatRequest, ChatRenderer, parses_output=True
        ),
        "completions": EndpointSpec(
            "completions",
            "/v1/completions",
            CompletionRequest,
            CompletionRenderer,
            parses_output=False,
        ),
    }
)
