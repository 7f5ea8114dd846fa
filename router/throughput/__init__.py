"""The throughput path: vLLM's native prefill/decode disaggregation, as proxy, pull or push.
Each mode is a `router.serving.ServePath`, chosen once from configuration."""

from router.throughput.factory import make_throughput_path

__all__ = ["make_throughput_path"]
