"""Leg bodies of pull and push modes: exactly the changes docs/protocols.md §2.2/§2.3 list."""

from __future__ import annotations

from router.upstream.vllm import (
    PrefillEngine,
    nixl_prefill_params,
    pull_decode_body,
    push_decode_body,
)
from router.upstream.vllm import prefill_body as vllm_prefill_body
from tests.support.legs import NIXL_PREFILL_PARAMS


def prefill_body(body: dict) -> dict:
    return vllm_prefill_body(body, nixl_prefill_params())


CLIENT = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "stream_options": {"include_usage": True},
    "max_tokens": 64,
    "max_completion_tokens": 64,
    "min_tokens": 4,
    "min_completion_tokens": 4,
    "temperature": 0.5,
    "chat_template_kwargs": {"enable_thinking": False},
}

PULL_PREFILL_PARAMS = NIXL_PREFILL_PARAMS


def test_prefill_body_is_one_token_without_stream_or_minimum() -> None:
    assert prefill_body(CLIENT) == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
        "max_tokens": 1,
        "max_completion_tokens": 1,
        "temperature": 0.5,
        "chat_template_kwargs": {"enable_thinking": False},
        "kv_transfer_params": PULL_PREFILL_PARAMS,
    }
    assert CLIENT["stream"] is True, "the client's body is not modified"


def test_prefill_body_adds_no_completion_budget_alias_the_client_did_not_send() -> None:
    body = prefill_body({"model": "m", "prompt": "x"})
    assert body == {
        "model": "m",
        "prompt": "x",
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": PULL_PREFILL_PARAMS,
    }


def test_pull_decode_body_is_the_client_body_with_the_opaque_params() -> None:
    opaque = {"remote_engine_id": "e", "remote_block_ids": [1, 2], "future_field": {"x": [None]}}
    assert pull_decode_body(CLIENT, opaque) == {**CLIENT, "kv_transfer_params": opaque}


def test_pull_decode_body_without_params_is_the_client_body() -> None:
    assert pull_decode_body(CLIENT, None) == CLIENT


def test_push_decode_body_names_the_prefill_engine_and_the_shared_id() -> None:
    engine = PrefillEngine(
        url="http://p:8000",
        engine_id="engine-p0",
        side_channel_host="10.0.0.7",
        side_channel_port=5600,
        tp_size=8,
        pp_size=2,
    )
    assert push_decode_body(CLIENT, engine, "abc123") == {
        **CLIENT,
        "kv_transfer_params": {
            "do_remote_decode": False,
            "do_remote_prefill": True,
            "remote_engine_id": "engine-p0",
            "remote_host": "10.0.0.7",
            "remote_port": 5600,
            "tp_size": 8,
            "pp_size": 2,
            "remote_request_id": "abc123",
        },
    }
