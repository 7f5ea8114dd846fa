"""Explicit sampling for both legs, and the node's options resolved from a request."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.latency.sampling import (
    NODE_TOP_K_OFF,
    SamplingDefaults,
    decode_options,
    grammar_spec,
    resolve,
)
from router.openai.requests import ChatRequest, CompletionRequest

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def chat(**extra: object) -> ChatRequest:
    return ChatRequest.model_validate({**CHAT, **extra})


def test_unset_values_take_vllms_defaults_on_both_legs() -> None:
    sampling = resolve(chat(), SamplingDefaults())
    assert sampling.for_prefill() == {"temperature": 1.0, "top_p": 1.0, "top_k": -1}
    assert sampling.for_node() == {"temperature": 1.0, "top_p": 1.0, "top_k": NODE_TOP_K_OFF}


@pytest.mark.parametrize(("top_k", "prefill", "node"), [(-1, -1, 256), (0, -1, 256), (20, 20, 20)])
def test_top_k_off_is_spelled_for_each_leg(top_k: int, prefill: int, node: int) -> None:
    sampling = resolve(chat(top_k=top_k), SamplingDefaults(top_k=50))
    assert (sampling.for_prefill()["top_k"], sampling.for_node()["top_k"]) == (prefill, node)


def test_a_generation_config_supplies_what_the_request_leaves_unset(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(
        '{"temperature": 0.6, "top_p": 0.95, "top_k": -1, "eos_token_id": 1}'
    )
    defaults = SamplingDefaults.from_generation_config(tmp_path)
    assert defaults == SamplingDefaults(temperature=0.6, top_p=0.95, top_k=None)
    sampling = resolve(chat(top_p=0.5), defaults)
    assert sampling.for_node() == {"temperature": 0.6, "top_p": 0.5, "top_k": NODE_TOP_K_OFF}


def test_an_unreadable_generation_config_is_named(tmp_path: Path) -> None:
    (tmp_path / "g.json").write_text("[1]")
    with pytest.raises(ValueError, match=r"g\.json"):
        SamplingDefaults.from_generation_config(tmp_path / "g.json")
    with pytest.raises(ValueError, match="missing"):
        SamplingDefaults.from_generation_config(tmp_path / "missing")


def test_node_options_carry_what_the_guard_let_through() -> None:
    options = decode_options(
        chat(temperature=0, repetition_penalty=1.1, ignore_eos=True, logprobs=True),
        {},
        SamplingDefaults(),
    )
    assert options.node_sampling == {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": NODE_TOP_K_OFF,
        "repetition_penalty": 1.1,
        "ignore_eos": True,
    }
    assert options.top_logprobs == 0
    assert options.grammar_spec is None


def test_completions_logprobs_count_is_the_top_candidates() -> None:
    parsed = CompletionRequest.model_validate({"model": "m", "prompt": "p", "logprobs": 3})
    assert decode_options(parsed, {}, SamplingDefaults()).top_logprobs == 3
    plain = CompletionRequest.model_validate({"model": "m", "prompt": "p"})
    assert decode_options(plain, {}, SamplingDefaults()).top_logprobs is None


@pytest.mark.parametrize(
    ("response_format", "spec"),
    [
        (None, None),
        ({"type": "text"}, None),
        ({"type": "json_object"}, {"type": "json_object", "value": None}),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
            {"type": "json_schema", "value": {"type": "object"}},
        ),
        # malformed: passed on for the node to refuse, never a gateway error
        (
            {"type": "json_schema", "json_schema": "not an object"},
            {"type": "json_schema", "value": None},
        ),
        ({"type": "json_schema"}, {"type": "json_schema", "value": None}),
    ],
)
def test_response_format_becomes_the_nodes_grammar(
    response_format: object, spec: dict[str, object] | None
) -> None:
    assert grammar_spec(response_format) == spec
