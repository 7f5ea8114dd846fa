"""The two legs of vLLM's NIXL disaggregation (PROTOCOLS.md §2.2, §2.3), shared by pull and push.

The bodies change the client's request in exactly the ways the protocol lists and no other;
`kv_transfer_params` coming back from a prefill is opaque and passed on verbatim.
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from router.config import PrefillEngineConfig, TimeoutsConfig
from router.errors import PrefillError
from router.throughput.upstream import (
    Leg,
    Reply,
    Upstream,
    leg_timeout,
    relay,
    send_leg,
    status_failure,
)
from router.throughput.usage import CachedTokensRewriter

log = logging.getLogger("pd_gateway.throughput")

# Fields a one-token prefill must not carry: the client's stream settings and a minimum
# length it could not honour.
_NOT_IN_PREFILL = ("stream_options", "min_tokens", "min_completion_tokens", "kv_transfer_params")


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill leg: one token, no stream, and a request to keep the KV for a remote decode."""
    out = {k: v for k, v in body.items() if k not in _NOT_IN_PREFILL}
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    return out


def pull_decode_body(body: dict[str, Any], kv_transfer_params: Any) -> dict[str, Any]:
    """The client's body with the prefill's `kv_transfer_params`, untouched.

    Without any (the prefill finished without keeping KV for a remote decode), the decode
    instance computes the prompt itself: slower, but the answer is still right.
    """
    out = {k: v for k, v in body.items() if k != "kv_transfer_params"}
    if kv_transfer_params is not None:
        out["kv_transfer_params"] = kv_transfer_params
    return out


def push_decode_body(
    body: dict[str, Any], engine: PrefillEngineConfig, request_id: str
) -> dict[str, Any]:
    """The client's body with the chosen prefill engine's coordinates; no block ids."""
    out = {k: v for k, v in body.items() if k != "kv_transfer_params"}
    out["kv_transfer_params"] = {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "remote_engine_id": engine.engine_id,
        "remote_host": engine.side_channel_host,
        "remote_port": engine.side_channel_port,
        "tp_size": engine.tp_size,
        "pp_size": engine.pp_size,
        "remote_request_id": request_id,
    }
    return out


def is_stream(body: dict[str, Any]) -> bool:
    return body.get("stream") is True


def prefill_leg(url: str, path: str, request_id: str, timeouts: TimeoutsConfig) -> Leg:
    read = timeouts.prefill_s
    return Leg("prefill", url, path, request_id, leg_timeout(timeouts, read_s=read), PrefillError)


def decode_leg(
    url: str, path: str, request_id: str, timeouts: TimeoutsConfig, *, body: dict[str, Any]
) -> Leg:
    # A non-stream answer only arrives when generation ends: no bound on that wait.
    read = timeouts.prefill_s if is_stream(body) else None
    return Leg("decode", url, path, request_id, leg_timeout(timeouts, read_s=read))


@dataclass(frozen=True, slots=True)
class PrefillAnswer:
    kv_transfer_params: Any
    """Opaque: whatever the prefill returned at the top level, None if nothing."""
    cached_tokens: int
    """The prefill's own prefix-cache hits; 0 when it did not report them."""


async def run_prefill(http: httpx.AsyncClient, leg: Leg, body: dict[str, Any]) -> PrefillAnswer:
    """Send the prefill leg for the client's `body` and read what the decode leg needs."""
    async with AsyncExitStack() as stack:
        reply = await send_leg(http, leg, prefill_body(body), stack)
        if reply.status != 200:
            raise status_failure(reply)
        try:
            data = orjson.loads(reply.content or b"")
        except orjson.JSONDecodeError:
            data = None
    if not isinstance(data, dict):
        raise PrefillError("the prefill leg's answer is not a JSON object", code="prefill_failed")
    params = data.get("kv_transfer_params")
    if params is None:
        log.warning(
            "prefill %s returned no kv_transfer_params (request %s): the decode computes the "
            "prompt itself; is the prefill server running a NIXL kv connector?",
            leg.url,
            leg.request_id,
        )
    return PrefillAnswer(kv_transfer_params=params, cached_tokens=_cached_tokens(data))


def decode_answer(reply: Reply, prefill: PrefillAnswer) -> Upstream:
    """The decode leg's answer as the client sees it: unchanged but for `cached_tokens`."""
    if reply.status != 200:
        raise status_failure(reply)
    rewriter = CachedTokensRewriter(prefill.cached_tokens)
    if reply.content is not None:
        return relay(reply, body=rewriter.body(reply.content))
    return relay(reply, rewrite=rewriter)


def _cached_tokens(data: dict[str, Any]) -> int:
    usage = data.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) else 0
