"""The one way to call a backend: pooled clients, limits and timeouts from configuration, and
the one translation of transport failures and upstream statuses (`client`, `failures`), over
a `transport` interface with two implementations (`http1`: the gateway's own pool;
`httpx_transport`: httpx's), with the wire shapes of each backend on top (`vllm`: vLLM's
OpenAI server; `tilert`: a TileRT node). Nothing outside this package imports httpx to call
a backend, nor sees its exceptions."""

from router.upstream.client import Reply, Upstreams
from router.upstream.failures import Target, status_failure, transport_failure, upstream_status
from router.upstream.timeouts import Timeouts

__all__ = [
    "Reply",
    "Target",
    "Timeouts",
    "Upstreams",
    "status_failure",
    "transport_failure",
    "upstream_status",
]
