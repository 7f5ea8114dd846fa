"""The access record of one API request: one structured log line, filled in along the way
(the decision by the dispatcher, the node, waits and tokens by the latency path) and
written by `RequestContext` when the response ends."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from router.errors import GatewayError


@dataclass(slots=True)
class AccessRecord:
    """What one request's access line says; the paths fill in what they know."""

    request_id: str
    client: str | None = None
    """The client's address (the peer's, or what a trusted proxy in front reported)."""
    key_name: str | None = None
    """The API key's name, when the request had one."""
    tenant: str | None = None
    """Who the request is from (`tenants.identify`)."""
    stream: bool | None = None
    upstream_request_id: str | None = None
    """The X-Request-Id the backends saw (dash-free, as vLLM and TileRT need it)."""
    model: str | None = None
    path: str | None = None
    rule: str | None = None
    reroute_reason: str | None = None
    node: str | None = None
    prefill: str | None = None
    continued: int = 0
    """Times the answer went on elsewhere after its node (or, on the native path, its decode
    server) failed mid-stream."""
    broken_nodes: str | None = None
    """The nodes whose streams broke, in order (comma-separated); `node` is the last one's
    successor."""
    broken_servers: str | None = None
    """The native path's decode servers whose streams broke, in order (comma-separated);
    `upstream` is the last one's successor."""
    native_decode: str | None = None
    """The vLLM server of the native path that went on with the output when no node was free
    (then also `upstream`)."""
    upstream: str | None = None
    """The vLLM server (or proxy) whose answer the client got: on the latency path the
    prefill server, on the native path the decode instance or the proxy."""
    upstream_reason: str | None = None
    """Why that server was chosen (`load`, `only_healthy`, `rotation`, `retry_...`)."""
    native_way: str | None = None
    """`pull` and `push`: `split` into legs, or `whole` on the decode server."""
    native_way_reason: str | None = None
    """Why (`uncached`, `cached`, `prefill_busy`, `scores_prompt`, `not_split`, `always`,
    `objective`)."""
    way: str | None = None
    """With an objective: the way it chose (`whole`, `split`, `tilert`, `proxy`)."""
    way_reason: str | None = None
    """Why (`meets`, `least_miss`, `queue`, `none_meets`)."""
    predicted_ttft_ms: float | None = None
    predicted_itl_ms: float | None = None
    objective_met: bool | None = None
    """Whether the measured first-token time and mean gap met the objective (None where the
    gateway does not see them: a non-streamed or Responses answer)."""
    uncached_tokens: int | None = None
    """Prompt tokens the serving side had to compute, where the gateway knew it."""
    running: int | None = None
    """Requests the vLLM server answering it had in flight, this one included, when sent."""
    queue_wait_ms: float | None = None
    prefill_ms: float | None = None
    """The prefill leg's time (latency path, split native path)."""
    prefill_tokens: int | None = None
    """The tokens that prefill computed (its prompt less its cache hits)."""
    ttft_ms: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    status: int | None = None
    """The HTTP status; for an answer that ended with an error after it started (a stream's
    error event, an answer cut at shutdown), that error's status."""
    error_code: str | None = None
    """The code of the error the answer carried, if any (`shutting_down` for a cut)."""
    duration_ms: float | None = None
    client_gone: bool = False
    _gap_s: float = 0.0
    _gap_tokens: int = 0

    def prefilled(self, seconds: float, computed_tokens: int | None) -> None:
        """The prefill leg took `seconds` and computed that many of the prompt's tokens."""
        self.prefill_ms = round(seconds * 1e3, 3)
        self.prefill_tokens = computed_tokens

    def token_gap(self, seconds: float, tokens: int) -> None:
        """`tokens` more arrived `seconds` after the ones before them."""
        self._gap_s += seconds
        self._gap_tokens += tokens

    @property
    def itl_s(self) -> float | None:
        """The mean gap between the answer's tokens after its first (None: no gap seen)."""
        return self._gap_s / self._gap_tokens if self._gap_tokens else None

    def ended_with(self, error: GatewayError) -> None:
        """The answer ended with `error`: before it started, or as its last event."""
        self.status = error.status
        self.error_code = error.code or error.error_type

    def to_dict(self) -> dict[str, Any]:
        """Every field by name, for the log line (flat values: no deep copy needed)."""
        line = {name: getattr(self, name) for name in _FIELDS}
        itl_s = self.itl_s
        line["itl_ms"] = None if itl_s is None else round(itl_s * 1e3, 3)
        return line


_FIELDS = tuple(field.name for field in fields(AccessRecord) if not field.name.startswith("_"))
