"""vLLM's OpenAI server as the gateway calls it (docs/protocols.md §1.1, §2): the one-token
prefill both paths send, what the latency path reads from its answer (the first token id),
what the native path reads (the opaque `kv_transfer_params`), and the NIXL decode legs.

Bodies change the client's request in exactly the ways the protocol lists and no other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from policies.types import Endpoint
from router.errors import PrefillError, UpstreamError
from router.node import Node
from router.upstream.client import Upstreams
from router.upstream.failures import Target

log = logging.getLogger("pd_gateway.upstream")

PREFILL = Target("prefill", "the prefill server", PrefillError)
DECODE = Target("decode", "the decode server")
PROXY = Target("proxy", "the disaggregation proxy")
HEALTH = Target("health", "the vLLM server's health check")
MODELS = Target("models", "the vLLM server's model list")

TOKEN_ID_PREFIX = "token_id:"

# Fields a one-token prefill must not carry: the client's stream settings, a minimum length
# it could not honour, and transfer parameters that are the gateway's to set.
_NOT_IN_PREFILL = ("stream_options", "min_tokens", "min_completion_tokens", "kv_transfer_params")


def _chat_first(logprobs: Any) -> tuple[Any, Any, list[tuple[Any, Any]]]:
    entry = logprobs["content"][0]
    top = [(t["token"], t["logprob"]) for t in entry.get("top_logprobs") or ()]
    return entry["token"], entry.get("logprob"), top


def _completion_first(logprobs: Any) -> tuple[Any, Any, list[tuple[Any, Any]]]:
    top = (logprobs.get("top_logprobs") or [None])[0] or {}
    return logprobs["tokens"][0], (logprobs.get("token_logprobs") or [None])[0], [*top.items()]


# How each endpoint asks for the first token's logprob (and `n` top candidates), and where
# its answer puts the token, its logprob and the candidates.
_FIRST_TOKEN: Mapping[
    Endpoint,
    tuple[Callable[[int], dict[str, Any]], Callable[[Any], tuple[Any, Any, list[tuple[Any, Any]]]]],
] = MappingProxyType(
    {
        "chat": (lambda n: {"logprobs": True, "top_logprobs": n}, _chat_first),
        "completions": (lambda n: {"logprobs": n}, _completion_first),
    }
)


def prefill_body(
    body: dict[str, Any],
    kv_transfer_params: dict[str, Any],
    *,
    first_token_of: Endpoint | None = None,
    top_logprobs: int = 1,
    sampling: Mapping[str, Any] | None = None,
    prompt_token_ids: list[int] | None = None,
    return_token_ids: bool = False,
) -> dict[str, Any]:
    """One token, not streamed, with the gateway's `kv_transfer_params`; with `first_token_of`,
    the first token's logprob (and `top_logprobs` candidates) is asked for in that
    endpoint's shape (the latency path), and `sampling` replaces the client's settings.

    `prompt_token_ids`: a chat prompt already rendered and encoded, which vLLM (0.32) takes
    from `kv_transfer_params` instead of rendering the messages (§1.1); the request stays a
    chat request, so everything else about it and its answer is as without. A completion's
    prompt is replaced by them. `return_token_ids`: the answer names the prompt's ids."""
    out = {k: v for k, v in body.items() if k not in _NOT_IN_PREFILL}
    if return_token_ids:
        out["return_token_ids"] = True
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    if first_token_of is not None:
        out.update(_FIRST_TOKEN[first_token_of][0](max(1, top_logprobs)))
    if sampling is not None:
        out.update(sampling)
    if prompt_token_ids is not None:
        if first_token_of == "completions":
            out["prompt"] = prompt_token_ids
            out.pop("echo", None)
        else:
            kv_transfer_params = {**kv_transfer_params, "prompt_token_ids": prompt_token_ids}
    out["kv_transfer_params"] = kv_transfer_params
    return out


def continuation_body(
    model: str,
    token_ids: list[int],
    *,
    max_tokens: int,
    sampling: Mapping[str, Any],
    stop_token_ids: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The rest of an output from a server that serves whole: a streamed completions
    request whose prompt is `token_ids` (a prompt and its output so far), each chunk naming
    its ids (`return_token_ids`). Stop strings stay the gateway's to match on the ids; stop
    token ids end it as they end a node's."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": token_ids,
        "max_tokens": max_tokens,
        "stream": True,
        "return_token_ids": True,
        **sampling,
    }
    if stop_token_ids:
        body["stop_token_ids"] = list(stop_token_ids)
    return body


def tilert_params(node: Node) -> dict[str, Any]:
    """Where the TileRT connector pushes the prompt's KV state (§1.1)."""
    return {"tilert_host": node.host, "tilert_ctrl_port": node.ctrl_port}


def nixl_prefill_params() -> dict[str, Any]:
    """A prefill that keeps its KV state for a remote decode to read (§2.2)."""
    return {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }


def pull_decode_body(body: dict[str, Any], kv_transfer_params: Any) -> dict[str, Any]:
    """The client's body with the prefill's `kv_transfer_params`, untouched.

    Without any, the decode gets none: a connector that hands the KV over by its own means
    (shared storage, LMCache) loads it anyway; with NIXL's, the decode computes the prompt
    itself (slower, but the answer is still right).
    """
    out = {k: v for k, v in body.items() if k != "kv_transfer_params"}
    if kv_transfer_params is not None:
        out["kv_transfer_params"] = kv_transfer_params
    return out


@dataclass(frozen=True, slots=True)
class PrefillEngine:
    """A prefill instance as push-mode decode legs must name it (its NIXL side channel)."""

    url: str
    engine_id: str
    side_channel_host: str
    side_channel_port: int
    tp_size: int = 1
    pp_size: int = 1


def push_decode_body(
    body: dict[str, Any], engine: PrefillEngine, request_id: str
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


async def prefill(
    upstreams: Upstreams, url: str, path: str, body: dict[str, Any], *, request_id: str
) -> Any:
    """Send a prefill body; its answer parsed as JSON (None if it is not JSON).

    Raises PrefillError: for an error status, or for a transport failure (`in_doubt` when the
    request may have reached vLLM, whose connector may then have pushed a transfer)."""
    reply = await upstreams.call(
        PREFILL,
        "POST",
        url,
        path,
        body=body,
        read_s=upstreams.timeouts.prefill_s,
        request_id=request_id,
    )
    if reply.status != 200:
        raise await reply.failure()
    return await reply.json()


TOKENIZE = Target("tokenize", "the vLLM server's /tokenize")


async def tokenize(upstreams: Upstreams, url: str, body: dict[str, Any]) -> list[int] | None:
    """The ids vLLM renders and encodes for a chat body (`messages`, `tools`,
    `chat_template_kwargs`) at `POST /tokenize`; None if the server answers no ids (no such
    endpoint, or it refuses the body). Raises UpstreamError if it does not answer."""
    reply = await upstreams.call(
        TOKENIZE, "POST", url, "/tokenize", body=body, read_s=upstreams.timeouts.prefill_s
    )
    if reply.status != 200:
        return None
    data = await reply.json()
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        return None
    return tokens


async def answers_health(upstreams: Upstreams, url: str) -> bool:
    """Whether the server at `url` answers `GET /health` without a server error (vLLM's is
    200 while its engine runs; a proxy without one answers 404, and is alive)."""
    try:
        reply = await upstreams.call(
            HEALTH, "GET", url, "/health", read_s=upstreams.timeouts.connect_s
        )
    except UpstreamError:
        return False
    return reply.status < 500


METRICS = Target("metrics", "the vLLM server's metrics")
# vLLM's page is tens of kilobytes (mostly histograms); anything far larger is not read.
MAX_METRICS_BYTES = 4 * 1024 * 1024


async def metrics_text(upstreams: Upstreams, url: str) -> str | None:
    """The server's `/metrics` page; None if it has none or one over `MAX_METRICS_BYTES`
    (not kept while it grows). Raises UpstreamError if it does not answer."""
    connect_s = upstreams.timeouts.connect_s
    reply = await upstreams.open(
        METRICS, "GET", url, "/metrics", read_s=connect_s, total_s=connect_s
    )
    try:
        if reply.status != 200:
            return None
        parts, size = [], 0
        async for chunk in reply.chunks():
            size += len(chunk)
            if size > MAX_METRICS_BYTES:
                return None
            parts.append(chunk)
    finally:
        await reply.aclose()
    return b"".join(parts).decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class Prefilled:
    """What the latency path needs from a prefill's answer."""

    response_id: str
    created: int
    first_token_id: int
    prompt_tokens: int
    finish_reason: str | None
    cached_tokens: int | None
    first_logprob: float | None = None
    first_top: tuple[tuple[int, float], ...] = ()
    """The first token's top candidates (token id, logprob), best first."""
    system_fingerprint: str | None = None
    """The prefill server's (`vllm-<version>-<hash>`), which the answer carries as vLLM's."""
    prompt_token_ids: list[int] | None = None
    """The prompt's ids as the server took them, when asked for (`return_token_ids`) and
    answered whole (as many as `prompt_tokens`, every one an id)."""


def unusable_prefill(message: str) -> PrefillError:
    """A 200 answer without what the latency path needs (a configuration error upstream).
    In doubt: a 200 means the connector claimed the transfer."""
    return PrefillError(message, code="prefill_unusable", in_doubt=True)


def parse_prefilled(data: Any, endpoint: Endpoint) -> Prefilled:
    """The first token id (as `token_id:N`), the prompt length and the response id."""
    try:
        choice = data["choices"][0]
        token, logprob, top = _FIRST_TOKEN[endpoint][1](choice["logprobs"])
        usage = data["usage"]
        prompt_tokens = int(usage["prompt_tokens"])
        details = usage.get("prompt_tokens_details") or {}
        response_id = str(data["id"])
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        raise unusable_prefill(
            "the prefill server's answer lacks the first token's logprobs or usage"
        ) from None
    return Prefilled(
        response_id=response_id,
        created=int(data.get("created") or 0),
        first_token_id=_token_id(token),
        prompt_tokens=prompt_tokens,
        finish_reason=choice.get("finish_reason"),
        cached_tokens=details.get("cached_tokens"),
        first_logprob=float(logprob) if isinstance(logprob, int | float) else None,
        first_top=tuple((_token_id(t), float(lp)) for t, lp in top if isinstance(lp, int | float)),
        system_fingerprint=_fingerprint(data.get("system_fingerprint")),
        prompt_token_ids=_prompt_ids(
            data.get("prompt_token_ids") if endpoint == "chat" else choice.get("prompt_token_ids"),
            prompt_tokens,
        ),
    )


def _prompt_ids(value: Any, prompt_tokens: int) -> list[int] | None:
    """The prompt's ids an answer names, or None where they are absent or not the prompt's
    (a count other than its usage says, or anything but ids)."""
    if not isinstance(value, list) or len(value) != prompt_tokens:
        return None
    if not all(type(i) is int and i >= 0 for i in value):
        return None
    return value


def _fingerprint(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _token_id(token: Any) -> int:
    if not isinstance(token, str) or not token.startswith(TOKEN_ID_PREFIX):
        raise unusable_prefill(
            "the prefill server returned the first token as text, not 'token_id:N': "
            "run vLLM with --return-tokens-as-token-ids"
        )
    try:
        return int(token[len(TOKEN_ID_PREFIX) :])
    except ValueError:
        raise unusable_prefill(
            f"the prefill server returned a malformed token id {token!r}"
        ) from None


@dataclass(frozen=True, slots=True)
class NixlPrefilled:
    """What a NIXL decode leg needs from a prefill's answer."""

    kv_transfer_params: Any
    """Opaque: whatever the prefill returned at the top level, None if nothing."""
    cached_tokens: int
    """The prefill's own prefix-cache hits; 0 when it did not report them."""
    prompt_tokens: int | None = None
    """The prompt's length as the prefill counted it; None when it did not say."""


def parse_nixl_prefilled(data: Any, *, url: str, request_id: str) -> NixlPrefilled:
    if not isinstance(data, dict):
        raise PrefillError(
            "the prefill server's answer is not a JSON object", code="prefill_failed"
        )
    params = data.get("kv_transfer_params")
    if params is None:
        # Not a fault the gateway can see: only NIXL's connectors answer with parameters
        # for the decode; others (shared storage, LMCache, Mooncake's store) hand the KV
        # over by their own means and answer none, and the decode loads it all the same.
        # Only the decode knows whether it had to compute the prompt itself.
        log.debug(
            "prefill %s returned no kv_transfer_params (request %s): the decode is sent "
            "none; with a NIXL connector it computes the prompt itself, with a connector "
            "that hands the KV over by its own means (shared storage, LMCache) it loads it",
            url,
            request_id,
        )
    usage = data.get("usage")
    prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return NixlPrefilled(
        kv_transfer_params=params,
        cached_tokens=_cached_tokens(data),
        prompt_tokens=prompt if isinstance(prompt, int) and prompt >= 0 else None,
    )


def _cached_tokens(data: dict[str, Any]) -> int:
    usage = data.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) else 0
