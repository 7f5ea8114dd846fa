"""The endpoint table: every generation endpoint the gateway serves, in one place.

Each entry says what clients call it by (the URL path), how its request is validated, which
vLLM request shape the latency path speaks for it, how the latency path renders its answer,
and whether the model's output parser (reasoning and tool calls) applies. Routes, metrics,
upstream calls and the paths all read it from here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from policies.types import Endpoint
from router.errors import GatewayError
from router.openai.render import ChatRenderer, CompletionRenderer
from router.openai.requests import ChatRequest, CompletionRequest, ResponsesRequest
from router.openai.responses_render import ResponsesRenderer, failure_event
from router.openai.sse import sse_failure

Wire = Literal["chat", "completions"]
WIRE_PATHS: Mapping[Wire, str] = MappingProxyType(
    {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
)


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    name: Endpoint
    path: str
    """At the gateway, and at vLLM for the native path (the client's body unchanged)."""
    request: type[ChatRequest] | type[CompletionRequest] | type[ResponsesRequest]
    renderer: type[ChatRenderer] | type[CompletionRenderer] | type[ResponsesRenderer]
    parses_output: bool
    """Messages out: the model's reasoning and tool-call parser applies."""
    wire: Wire
    """The vLLM request shape the latency path (and classification) works on."""
    disaggregates: bool = True
    """vLLM takes `kv_transfer_params` on this endpoint, so the native path may split it into
    prefill and decode legs; otherwise a decode instance serves it whole."""
    stream_failure: Callable[[GatewayError], bytes] = sse_failure
    """How an event stream of this endpoint ends when it fails after its first byte (an
    upstream gone mid-stream, a shutdown's cut), when no renderer follows the stream."""

    @property
    def wire_path(self) -> str:
        return WIRE_PATHS[self.wire]


ENDPOINTS: Mapping[Endpoint, EndpointSpec] = MappingProxyType(
    {
        "chat": EndpointSpec(
            "chat",
            "/v1/chat/completions",
            ChatRequest,
            ChatRenderer,
            parses_output=True,
            wire="chat",
        ),
        "completions": EndpointSpec(
            "completions",
            "/v1/completions",
            CompletionRequest,
            CompletionRenderer,
            parses_output=False,
            wire="completions",
        ),
        "responses": EndpointSpec(
            "responses",
            "/v1/responses",
            ResponsesRequest,
            ResponsesRenderer,
            parses_output=True,
            wire="chat",
            disaggregates=False,
            stream_failure=failure_event,
        ),
    }
)


def endpoint_at(path: str) -> EndpointSpec | None:
    """The endpoint served at `path`, if any."""
    return _ENDPOINT_OF_PATH.get(path)


def endpoint_meant(path: str) -> EndpointSpec | None:
    """The endpoint a client probably meant by a path that is not one: the table's path
    without its `/v1` (a base URL lacking it), with `/v1` twice, or with a trailing slash."""
    rest = path.rstrip("/")
    while rest.startswith("/v1/"):
        rest = rest.removeprefix("/v1")
    return _ENDPOINT_OF_PATH.get("/v1" + rest)


_ENDPOINT_OF_PATH = {endpoint.path: endpoint for endpoint in ENDPOINTS.values()}
