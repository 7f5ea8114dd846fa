"""Bounds on what one request may carry, checked on the parsed body before any other work.

A gateway is one event loop shared by every client: each size, count and depth a client
controls is bounded here, in one pass over the body whose cost is linear in its size, and
an excess is a 400 that names the limit (its `router.yaml` field). Only then is the body
validated, classified and sent anywhere.
"""

from __future__ import annotations

from typing import Any

from router.config import LimitsConfig
from router.errors import InvalidRequest

# Where a client could put transfer parameters that vLLM would act on: the top level, and
# `vllm_xargs` (vLLM merges it into the sampling parameters' extra args, where its
# connectors read `kv_transfer_params`). They decide where KV state is written by RDMA:
# never the client's.
_KV_KEY = "kv_transfer_params"


def check_limits(body: dict[str, Any], limits: LimitsConfig) -> None:
    """Raise InvalidRequest (400) naming the first limit `body` exceeds."""
    _check_depth(body, limits.max_json_depth)
    _check_count(body.get("messages"), limits.max_messages, "messages", "max_messages")
    _check_count(body.get("tools"), limits.max_tools, "tools", "max_tools")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        _check_count(prompt, limits.max_prompts, "prompt", "max_prompts")
    stop = body.get("stop")
    stops = stop if isinstance(stop, list) else [stop] if isinstance(stop, str) else []
    _check_count(stops, limits.max_stop_strings, "stop", "max_stop_strings")
    for s in stops:
        if isinstance(s, str) and len(s) > limits.max_stop_chars:
            raise _exceeded(
                f"a stop string is {len(s)} characters long",
                "stop",
                "max_stop_chars",
                limits.max_stop_chars,
            )
    ids = body.get("stop_token_ids")
    _check_count(ids, limits.max_stop_strings, "stop_token_ids", "max_stop_strings")


def strip_transfer_params(body: dict[str, Any]) -> None:
    """Remove every carrier of `kv_transfer_params` a client could use, in place."""
    for key in [k for k in body if k.lower() == _KV_KEY]:
        del body[key]
    xargs = body.get("vllm_xargs")
    if isinstance(xargs, dict):
        for key in [k for k in xargs if isinstance(k, str) and k.lower() == _KV_KEY]:
            del xargs[key]


def check_token_ids(body: dict[str, Any], vocab_size: int) -> None:
    """Token ids in `prompt` and `stop_token_ids` must be ids of the model's vocabulary."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt:
        lists = [prompt] if isinstance(prompt[0], int) else prompt
        for ids in lists:
            if isinstance(ids, list):
                _check_ids(ids, vocab_size, "prompt")
    stop_ids = body.get("stop_token_ids")
    if isinstance(stop_ids, list):
        _check_ids(stop_ids, vocab_size, "stop_token_ids")


def _check_ids(ids: list[Any], vocab_size: int, param: str) -> None:
    for token in ids:
        if type(token) is int and not 0 <= token < vocab_size:
            raise InvalidRequest(
                f"'{param}': token id {token} is not in the model's vocabulary "
                f"(0 to {vocab_size - 1})",
                param=param,
            )


def _check_count(value: Any, limit: int, param: str, field: str) -> None:
    if isinstance(value, list) and len(value) > limit:
        raise _exceeded(f"'{param}' has {len(value)} entries", param, field, limit)


def _check_depth(body: dict[str, Any], limit: int) -> None:
    """Nesting of objects and arrays, walked without recursion; stops at the first excess."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            raise _exceeded(
                f"the request nests JSON objects and arrays deeper than {limit} levels",
                None,
                "max_json_depth",
                limit,
            )
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values() if isinstance(v, dict | list))
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value if isinstance(v, dict | list))


def _exceeded(what: str, param: str | None, field: str, limit: int) -> InvalidRequest:
    return InvalidRequest(
        f"{what}; the limit is {limit} (limits.{field})", param=param, code="limit_exceeded"
    )
