"""The JSON document of a run: settings, machine, and per level and method every measure,
with what each router adds to direct orchestration."""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import asdict
from typing import Any

from bench.options import BenchOptions
from bench.rounds import Measured
from bench.scenarios import DIRECT, Level
from bench.stats import distribution
from router import __version__


def method_document(measured: Measured, concurrency: int, relayed: bool) -> dict[str, Any]:
    samples = measured.samples
    ttft = [s.ttft_s * 1e3 for s in samples]
    gaps = [g * 1e3 for s in samples for g in s.gaps_s]
    entry: dict[str, Any] = {
        "requests": len(samples),
        "chunks": sum(len(s.gaps_s) + 1 for s in samples),
        "ttft_ms": distribution(ttft),
        "gap_ms": distribution(gaps),
    }
    if measured.handoffs_s:
        entry["handoff_ms"] = distribution([g * 1e3 for g in measured.handoffs_s])
    if measured.relays.latencies_s or measured.relays.unpaired:
        entry["relay_ms"] = distribution([r * 1e3 for r in measured.relays.latencies_s])
        entry["relay_unpaired"] = measured.relays.unpaired
    entry["tokens_per_s"] = distribution([s.tokens_per_s for s in samples])
    if relayed and samples:
        growth = max(measured.rss_peak_mb) - measured.rss_one_stream_mb
        entry["cpu_ms_per_request"] = round(measured.cpu_s / len(samples) * 1e3, 3)
        entry["rss_idle_mb"] = round(statistics.median(measured.rss_before_mb), 2)
        entry["rss_peak_mb"] = round(max(measured.rss_peak_mb), 2)
        entry["rss_per_stream_kb"] = round(max(0.0, growth) * 1024 / max(1, concurrency - 1), 1)
    return entry


def added(routed: dict[str, Any], direct: dict[str, Any]) -> dict[str, float]:
    """What a router adds to direct orchestration, in ms: to the TTFT and the gaps, and to
    the hand-off and the batch relay where both measured it."""
    measures = [
        m
        for m in ("ttft", "gap", "handoff", "relay")
        if "p50" in routed.get(f"{m}_ms", {}) and "p50" in direct.get(f"{m}_ms", {})
    ]
    return {
        f"{measure}_{q}_ms": round(routed[f"{measure}_ms"][q] - direct[f"{measure}_ms"][q], 4)
        for measure in measures
        for q in ("p50", "p99")
    }


def level_document(level: Level, measured: dict[str, Measured]) -> dict[str, Any]:
    methods = {
        method.label: method_document(measured[method.label], level.concurrency, bool(method.pids))
        for method in level.methods
    }
    direct = methods[DIRECT]
    return {
        "path": level.path,
        "concurrency": level.concurrency,
        "pool_nodes": level.pool,
        "methods": methods,
        "added": {label: added(m, direct) for label, m in methods.items() if label != DIRECT},
    }


def document(
    options: BenchOptions, levels: list[dict[str, Any]], peers: dict[str, str]
) -> dict[str, Any]:
    settings = asdict(options)
    settings["out"] = str(options.out)
    settings["baseline"] = str(options.baseline) if options.baseline else None
    settings["report"] = str(options.report) if options.report else None
    settings["latency_levels"] = list(options.latency)
    return {
        "command": options.command,
        "version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "load_average": [round(v, 2) for v in os.getloadavg()],
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "settings": settings,
        "peers": peers,
        "levels": levels,
    }
