"""The throughput path: vLLM's native prefill/decode disaggregation, as proxy, pull or push."""

from router.throughput.base import ENDPOINT_PATHS, Endpoint, ThroughputPath
from router.throughput.factory import make_throughput_path

__all__ = ["ENDPOINT_PATHS", "Endpoint", "ThroughputPath", "make_throughput_path"]
