"""Turns a model's `throughput` configuration into its mode's implementation."""

from __future__ import annotations

import httpx

from router.config import ProxyConfig, PullConfig, PushConfig, TimeoutsConfig
from router.throughput.base import ThroughputPath
from router.throughput.proxy import ProxyPath
from router.throughput.pull import PullPath
from router.throughput.push import PushPath


def make_throughput_path(
    config: ProxyConfig | PullConfig | PushConfig,
    *,
    http: httpx.AsyncClient,
    timeouts: TimeoutsConfig,
) -> ThroughputPath:
    """The throughput path for one model; `http` is the application's shared client."""
    match config:
        case ProxyConfig():
            return ProxyPath(config, http=http, timeouts=timeouts)
        case PullConfig():
            return PullPath(config, http=http, timeouts=timeouts)
        case PushConfig():
            return PushPath(config, http=http, timeouts=timeouts)
    raise TypeError(f"not a throughput configuration: {type(config).__name__}")
