"""The prefill leg's body (exactly the changes of docs/protocols.md §1.1) and answer parsing."""

from __future__ import annotations

import logging

import pytest

from router.errors import PrefillError
from router.node import Node
from router.upstream.vllm import parse_nixl_prefilled, parse_prefilled, tilert_params
from router.upstream.vllm import prefill_body as vllm_prefill_body


def prefill_body(body: dict, *, chat: bool, node: Node) -> dict:
    endpoint = "chat" if chat else "completions"
    return vllm_prefill_body(body, tilert_params(node), first_token_of=endpoint)


def parse_prefill_response(data: object, *, chat: bool):
    return parse_prefilled(data, "chat" if chat else "completions")


NODE = Node(host="10.1.2.3", ctrl_port=5556, http_port=5557)


def test_chat_body_changes_only_what_the_protocol_lists() -> None:
    client = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_completion_tokens": 50,
        "max_tokens": 50,
        "temperature": 0.3,
        "chat_template_kwargs": {"thinking": True},
        "kv_transfer_params": {"tilert_host": "attacker"},
    }
    body = prefill_body(client, chat=True, node=NODE)
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
        "max_completion_tokens": 1,
        "max_tokens": 1,
        "temperature": 0.3,
        "chat_template_kwargs": {"thinking": True},
        "logprobs": True,
        "top_logprobs": 1,
        "kv_transfer_params": {"tilert_host": "10.1.2.3", "tilert_ctrl_port": 5556},
    }
    assert client["stream"] is True, "the client's body is not modified"


def test_completion_body_asks_for_one_logprob_and_no_completion_budget_alias() -> None:
    body = prefill_body({"model": "m", "prompt": "x"}, chat=False, node=NODE)
    assert body["logprobs"] == 1
    assert body["max_tokens"] == 1
    assert "max_completion_tokens" not in body
    assert "top_logprobs" not in body


def chat_answer(token: str) -> dict:
    return {
        "id": "chatcmpl-abc",
        "created": 7,
        "choices": [{"logprobs": {"content": [{"token": token}]}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 12, "prompt_tokens_details": {"cached_tokens": 4}},
    }


def test_parses_first_token_id_prompt_tokens_and_id() -> None:
    result = parse_prefill_response(chat_answer("token_id:42"), chat=True)
    assert (result.first_token_id, result.prompt_tokens, result.response_id) == (
        42,
        12,
        "chatcmpl-abc",
    )
    assert result.cached_tokens == 4
    assert result.finish_reason == "length"


def test_completion_answer_reads_logprobs_tokens() -> None:
    data = {
        "id": "cmpl-x",
        "choices": [{"logprobs": {"tokens": ["token_id:7"]}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3},
    }
    assert parse_prefill_response(data, chat=False).first_token_id == 7


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (chat_answer("Hello"), "--return-tokens-as-token-ids"),
        (chat_answer("token_id:x1"), "malformed token id"),
        ({"id": "x", "choices": [{"logprobs": None}]}, "lacks the first token"),
        ({"choices": []}, "lacks the first token"),
        ("not json object", "lacks the first token"),
    ],
)
def test_unusable_answers_fail_with_a_clear_message(data: object, needle: str) -> None:
    with pytest.raises(PrefillError) as failure:
        parse_prefill_response(data, chat=True)
    assert needle in failure.value.message
    assert failure.value.status == 502


def test_the_prefill_servers_fingerprint_is_kept() -> None:
    answer = {**chat_answer("token_id:42"), "system_fingerprint": "vllm-0.32.0-8f3995b0"}
    assert parse_prefill_response(answer, chat=True).system_fingerprint == "vllm-0.32.0-8f3995b0"
    assert parse_prefill_response(chat_answer("token_id:42"), chat=True).system_fingerprint is None
    odd = {**chat_answer("token_id:42"), "system_fingerprint": 7}
    assert parse_prefill_response(odd, chat=True).system_fingerprint is None


def test_a_prefill_without_kv_transfer_params_is_no_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Connectors that hand the KV over by their own means (shared storage, LMCache) answer
    # none, and the decode loads the KV all the same: nothing to warn about.
    caplog.set_level(logging.DEBUG, logger="pd_gateway.upstream")
    prefilled = parse_nixl_prefilled({"usage": {}}, url="http://p", request_id="r1")
    assert prefilled.kv_transfer_params is None
    records = [r for r in caplog.records if "kv_transfer_params" in r.getMessage()]
    assert [r.levelno for r in records] == [logging.DEBUG]
    assert "r1" in records[0].getMessage()
    params = {"do_remote_prefill": True, "remote_engine_id": "e"}
    caplog.clear()
    assert (
        parse_nixl_prefilled(
            {"kv_transfer_params": params}, url="http://p", request_id="r2"
        ).kv_transfer_params
        == params
    )
    assert not caplog.records
