"""The prefill leg of the latency path (PROTOCOLS.md §1.1): vLLM computes the prompt's KV
state, samples the first token and its TileRT connector pushes the state to the chosen node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from router.config import NodeConfig
from router.errors import PrefillError, upstream_message, upstream_status

TOKEN_ID_PREFIX = "token_id:"


@dataclass(frozen=True, slots=True)
class PrefillResult:
    response_id: str
    created: int
    first_token_id: int
    prompt_tokens: int
    finish_reason: str | None
    cached_tokens: int | None


def prefill_body(body: dict[str, Any], *, chat: bool, node: NodeConfig) -> dict:
    """The client's body with exactly the changes §1.1 lists, and nothing else."""
    out = {k: v for k, v in body.items() if k not in ("stream_options", "kv_transfer_params")}
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    if chat:
        out["logprobs"] = True
        out["top_logprobs"] = 1
    else:
        out["logprobs"] = 1
    out["kv_transfer_params"] = {"tilert_host": node.host, "tilert_ctrl_port": node.ctrl_port}
    return out


class UnusablePrefill(PrefillError):
    """A 200 answer without what the latency path needs (a configuration error upstream)."""


def parse_prefill_response(data: Any, *, chat: bool) -> PrefillResult:
    """Extract the first token id (as `token_id:N`), the prompt length and the response id."""
    try:
        choice = data["choices"][0]
        logprobs = choice["logprobs"]
        token = logprobs["content"][0]["token"] if chat else logprobs["tokens"][0]
        usage = data["usage"]
        prompt_tokens = int(usage["prompt_tokens"])
        details = usage.get("prompt_tokens_details") or {}
        response_id = str(data["id"])
    except (KeyError, IndexError, TypeError, ValueError):
        raise UnusablePrefill(
            "the prefill server's answer lacks the first token's logprobs or usage"
        ) from None
    if not isinstance(token, str) or not token.startswith(TOKEN_ID_PREFIX):
        raise UnusablePrefill(
            "the prefill server returned the first token as text, not 'token_id:N': "
            "run vLLM with --return-tokens-as-token-ids"
        )
    try:
        first_token_id = int(token[len(TOKEN_ID_PREFIX) :])
    except ValueError:
        raise UnusablePrefill(
            f"the prefill server returned a malformed token id {token!r}"
        ) from None
    return PrefillResult(
        response_id=response_id,
        created=int(data.get("created") or 0),
        first_token_id=first_token_id,
        prompt_tokens=prompt_tokens,
        finish_reason=choice.get("finish_reason"),
        cached_tokens=details.get("cached_tokens"),
    )


async def run_prefill(
    http: httpx.AsyncClient,
    url: str,
    *,
    chat: bool,
    body: dict[str, Any],
    request_id: str,
    timeout_s: float,
) -> PrefillResult:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    try:
        response = await http.post(
            url + path,
            content=orjson.dumps(body),
            headers={"content-type": "application/json", "x-request-id": request_id},
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
        )
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise PrefillError(
            f"the prefill server is unreachable: {type(exc).__name__}", code="prefill_unreachable"
        ) from None
    except httpx.TimeoutException:
        # The request reached vLLM: its connector may have pushed a transfer all the same.
        raise PrefillError(
            "the prefill server timed out", status=504, code="prefill_timeout", claimed=True
        ) from None
    except httpx.HTTPError as exc:
        raise PrefillError(
            f"the prefill server's answer broke off: {type(exc).__name__}",
            code="prefill_failed",
            claimed=True,
        ) from None
    if response.status_code != 200:
        detail = upstream_message(response.content)
        raise PrefillError(
            f"the prefill server answered {response.status_code}: {detail}",
            status=upstream_status(response.status_code),
            code="prefill_failed",
        )
    try:
        data = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        data = None
    try:
        return parse_prefill_response(data, chat=chat)
    except UnusablePrefill as exc:
        # 200 means the connector claimed the transfer: the node must still be given one
        # /pd/decode for it, though the first token is unknown.
        raise PrefillError(exc.message, code="prefill_unusable", claimed=True) from None
