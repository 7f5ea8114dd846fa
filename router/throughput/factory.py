"""Turns a model's `throughput` configuration into its mode's implementation."""

from __future__ import annotations

from router.config import ProxyConfig, PullConfig, PushConfig
from router.selection import PathSelection
from router.serving import ServePath
from router.telemetry.metrics import Metrics
from router.throughput.proxy import ProxyPath
from router.throughput.pull import PullPath
from router.throughput.push import PushPath
from router.upstream import Upstreams


def make_throughput_path(
    config: ProxyConfig | PullConfig | PushConfig,
    *,
    upstreams: Upstreams,
    selection: PathSelection | None = None,
    metrics: Metrics | None = None,
) -> ServePath:
    """The throughput path for one model, one of proxy, pull or push."""
    match config:
        case ProxyConfig():
            return ProxyPath(config, upstreams=upstreams, selection=selection, metrics=metrics)
        case PullConfig():
            return PullPath(config, upstreams=upstreams, selection=selection, metrics=metrics)
        case PushConfig():
            return PushPath(config, upstreams=upstreams, selection=selection, metrics=metrics)
    raise TypeError(f"not a throughput configuration: {type(config).__name__}")
