"""The one way to call a backend: pooled clients, timeouts from configuration, and the one
translation of transport failures and upstream statuses (`client`, `failures`), with the
wire shapes of each backend on top (`vllm`: vLLM's OpenAI server; `tilert`: a TileRT node).
Nothing outside this package imports httpx."""

from router.upstream.client import Reply, Upstreams
from router.upstream.failures import Target, status_failure, transport_failure, upstream_status

__all__ = ["Reply", "Target", "Upstreams", "status_failure", "transport_failure", "upstream_status"]
