"""pd-gateway: the OpenAI-compatible front door for prefill/decode disaggregated serving."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("pd-gateway")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
