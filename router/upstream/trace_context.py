"""The request's trace context on the calls made for it (W3C `traceparent`), so that vLLM and
the TileRT nodes can put their own spans under the gateway's."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.propagate import inject

from router.upstream.transport import RawHeaders


def add_trace_context(headers: RawHeaders) -> None:
    """Nothing unless a span is current (tracing on, inside a request)."""
    if not trace.get_current_span().get_span_context().is_valid:
        return
    carrier: dict[str, str] = {}
    inject(carrier)
    headers.extend((k.encode("latin-1"), v.encode("latin-1")) for k, v in carrier.items())
