"""The interface every throughput mode implements (PROTOCOLS.md §2).

A mode (proxy, pull, push) is a type chosen once from configuration by the factory;
handlers call `serve` and never branch on the mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal, Protocol

from starlette.responses import Response

Endpoint = Literal["chat", "completions"]

ENDPOINT_PATHS: Mapping[str, str] = MappingProxyType(
    {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
)


class ThroughputPath(Protocol):
    """Serves one request over vLLM's native prefill/decode disaggregation."""

    async def serve(
        self,
        body: dict[str, Any],
        *,
        endpoint: Endpoint,
        request_id: str,
        response_headers: dict[str, str],
    ) -> Response:
        """Answer the request.

        `body` is the client's validated JSON body with any client `kv_transfer_params`
        already removed; `request_id` is the X-Request-Id every upstream leg carries;
        `response_headers` go on the answer, error answers included. Upstream failures are
        rendered as OpenAI errors in the returned response, never raised. The upstream work
        runs when the response is sent, so a client that goes away aborts it.
        """
        ...

    def outstanding(self) -> dict[str, dict[str, int]]:
        """Requests in flight per upstream URL, by pool (`proxy`, or `prefill` and `decode`)."""
        ...
