"""The interface every way of serving a request implements: the latency path and each
throughput mode. A path turns a `RoutedRequest` into an `Answer` (status, headers, body
chunks); `PathResponse` sends it, so no path deals with the client connection."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, Callable, Hashable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Protocol

from policies import Decision
from router.errors import GatewayError, error_json
from router.gate import UNSHARED, Share
from router.objectives import Planned
from router.openai.endpoints import EndpointSpec
from router.openai.requests import ChatRequest, CompletionRequest
from router.selection import Affinity
from router.telemetry.access import AccessRecord


@dataclass(slots=True)
class RoutedRequest:
    """A validated, classified request on its way to a path."""

    endpoint: EndpointSpec
    parsed: ChatRequest | CompletionRequest
    body: dict[str, Any]
    """What the gateway works on: the client's JSON body with any client
    `kv_transfer_params` removed or, for a Responses request, the chat request it translates
    to (`router.openai.responses_input`)."""
    decision: Decision
    request_id: str
    """Carried by every upstream call as X-Request-Id."""
    headers: dict[str, str]
    """Added to the answer, error answers included; a path may change them (a spill)."""
    access: AccessRecord = field(default_factory=lambda: AccessRecord("-"))
    """The request's access line, for the paths to fill in."""
    client_body: dict[str, Any] | None = None
    """The client's body, when `body` is a translation of it."""
    client_headers: Mapping[str, str] = field(default_factory=dict)
    """The client's request headers (a session key may be among them)."""
    arrived: float = field(default_factory=time.monotonic)
    """When the request was routed (monotonic), for the time to its first bytes."""
    planned: Planned | None = None
    """The way its objective chose (None: no objective, the path's own choices)."""
    affinities: dict[Hashable, Affinity] = field(default_factory=dict)
    """What it offers request-aware scorers, as worked out for a path (its prompt encoded
    once for all paths whose keys have one shape)."""
    on_end: Callable[[], None] | None = None
    """Called once the answer has ended, however it ended (what it taught is learned)."""
    share: Share = UNSHARED
    """Its tenant's part of the TileRT pool, for the gate."""
    nodes_refused: bool = False
    """Its tenant's node time is spent: an objective's plan leaves the tilert way out."""
    on_node_released: Callable[[float], None] | None = None
    """Called with the seconds a node was held, as each node the answer held is given back."""

    @property
    def model(self) -> str:
        return self.parsed.model

    @property
    def splits(self) -> bool:
        """Served as prefill and decode legs by a disaggregated path: not when the endpoint
        is one vLLM does not split, nor when the request scores its prompt."""
        return self.endpoint.disaggregates and not self.parsed.scores_prompt

    @property
    def native_body(self) -> dict[str, Any]:
        """What vLLM's own endpoint (`endpoint.path`) is sent: the client's body."""
        return self.body if self.client_body is None else self.client_body


@dataclass(slots=True)
class Answer:
    """What the client is sent: status, headers and the body's chunks."""

    status: int
    headers: list[tuple[bytes, bytes]]
    chunks: AsyncGenerator[bytes, None]


class LastChunk(bytes):
    """A body's last chunk, said so: it goes out with the body's end, in one write."""


class ServePath(Protocol):
    async def open(self, request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        """Start serving `request`: return once its status is known.

        Raise a GatewayError for a failure before the answer starts; after that, failures
        belong in the body (an SSE error event). Everything that must be closed when the
        answer ends, however it ends (client gone included), goes on `stack`.
        """
        ...


def new_request_id() -> str:
    """A request id: dash-free, so vLLM and the TileRT node keep it as it is (§1.2)."""
    return uuid.uuid4().hex


async def single_chunk(content: bytes) -> AsyncGenerator[bytes, None]:
    """A body sent whole, as one chunk."""
    yield content


JSON_HEADERS = [(b"content-type", b"application/json")]


def whole_answer(status: int, headers: list[tuple[bytes, bytes]], content: bytes) -> Answer:
    """An answer whose body is known in full: sent in one piece, with its length."""
    length = [(b"content-length", str(len(content)).encode())]
    return Answer(status, headers + length, single_chunk(content))


def json_answer(content: bytes, *, status: int = 200) -> Answer:
    return whole_answer(status, JSON_HEADERS, content)


def error_answer(error: GatewayError) -> Answer:
    return whole_answer(error.status, JSON_HEADERS + raw_headers(error.headers), error_json(error))


def raw_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
