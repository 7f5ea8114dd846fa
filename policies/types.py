"""Shared vocabulary of the classification package: paths, endpoints, saturation behaviours."""

from __future__ import annotations

from typing import Literal

Path = Literal["latency", "throughput"]
"""Where a request is served: the TileRT decode pool, or vLLM's native disaggregation."""

Endpoint = Literal["chat", "completions", "responses"]
"""`/v1/chat/completions`, `/v1/completions` or `/v1/responses`. A Responses request is
classified as the chat request it translates to (its messages, tools and options)."""

OnSaturation = Literal["queue", "spill", "reject"]
"""What the gateway does when no TileRT slot is free in time (or the latency path fails
before the first byte): keep waiting up to the wait budget, move the request to the
throughput path, or answer 429."""

PATHS: tuple[Path, ...] = ("latency", "throughput")
ENDPOINTS: tuple[Endpoint, ...] = ("chat", "completions", "responses")
