"""Turns a model's `throughput` configuration into its mode's implementation: the one place
that reads it, so the modes work on their server sets alone."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from router.config import ProxyConfig, PullConfig, PushConfig
from router.selection import PathSelection
from router.serving import ServePath
from router.serving.objective import NativeWays
from router.telemetry.metrics import Metrics
from router.throughput.continuation import Continuing
from router.throughput.legs import NativeDeps, WholeWhen
from router.throughput.proxy import ProxyPath
from router.throughput.pull import PullPath
from router.throughput.push import PushPath
from router.throughput.whole import WholeServing
from router.upstream import Upstreams
from router.upstream.vllm import PrefillEngine


class ThroughputPath(ServePath, NativeWays, Protocol):
    whole: WholeServing
    """Its servers that serve a request whole (the decode instances, or the proxy)."""


def make_throughput_path(
    config: ProxyConfig | PullConfig | PushConfig,
    *,
    upstreams: Upstreams,
    selection: PathSelection | None = None,
    metrics: Metrics | None = None,
    continuing: Continuing | None = None,
) -> ThroughputPath:
    """The throughput path for one model, one of proxy, pull or push. `continuing`: how a
    split mode goes on with a stream whose decode server broke (its limit is the mode's
    `continuations`)."""
    selection = selection or PathSelection()
    if isinstance(config, ProxyConfig):
        proxies = selection.server_set(config.urls, "proxy", request_aware=False)
        return ProxyPath(proxies, NativeDeps(upstreams, metrics))
    if continuing is not None:
        continuing = replace(continuing, limit=config.continuations)
    deps = NativeDeps(upstreams, metrics, continuing)
    match config:
        case PullConfig():
            prefill = selection.server_set(config.prefill, "pull:prefill")
            decode = selection.server_set(config.decode, "pull:decode")
            return PullPath(prefill, decode, selection, deps, _whole_when(config))
        case PushConfig():
            engines = [PrefillEngine(**engine.model_dump()) for engine in config.prefill]
            decode = selection.server_set(config.decode, "push:decode")
            return PushPath(engines, decode, selection, deps, _whole_when(config))
    raise TypeError(f"not a throughput configuration: {type(config).__name__}")


def _whole_when(config: PullConfig | PushConfig) -> WholeWhen | None:
    conditional = config.conditional
    if conditional is None:
        return None
    return WholeWhen(conditional.min_uncached_tokens, conditional.prefill_busier_by)
