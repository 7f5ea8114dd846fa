"""The capability guard: every re-route reason, neutral values, and missing paths."""

from __future__ import annotations

from typing import Any

import pytest

from policies import (
    NO_THROUGHPUT_PATH,
    Capabilities,
    ModelCapabilities,
    RerouteReason,
    classify,
    features_from_request,
    parse_rules,
)
from policies.types import Endpoint

LATENCY_FOR_ALL = parse_rules({"default": {"name": "all", "path": "latency"}})
BOTH = ModelCapabilities(has_latency_pool=True, has_throughput=True, max_seq_len=1000)
CAPABILITIES = Capabilities(
    {
        "both": BOTH,
        "latency-only": ModelCapabilities(has_latency_pool=True, has_throughput=False),
        "throughput-only": ModelCapabilities(has_latency_pool=False, has_throughput=True),
    }
)
R = RerouteReason


def decide(
    body: dict[str, Any], endpoint: Endpoint = "chat", model: str = "both", tokens: int = 10
) -> Any:
    base = {"model": model, "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    features = features_from_request(
        {**base, **body}, endpoint=endpoint, headers={}, api_key_name=None
    )
    features.prompt_tokens = tokens
    return classify(features, LATENCY_FOR_ALL, CAPABILITIES)


@pytest.mark.parametrize(
    ("endpoint", "body", "reason"),
    [
        ("chat", {"n": 2}, R.N),
        ("completions", {"n": 3}, R.N),
        ("completions", {"best_of": 2}, R.BEST_OF),
        ("completions", {"use_beam_search": True}, R.USE_BEAM_SEARCH),
        ("completions", {"prompt": ["a", "b"]}, R.PROMPT),
        ("chat", {"logprobs": True}, R.LOGPROBS),
        ("completions", {"logprobs": 0}, R.LOGPROBS),
        ("completions", {"logprobs": 5}, R.LOGPROBS),
        ("chat", {"logprobs": False, "top_logprobs": 2}, R.TOP_LOGPROBS),
        ("chat", {"prompt_logprobs": 0}, R.PROMPT_LOGPROBS),
        ("completions", {"echo": True}, R.ECHO),
        # Prompt scoring (as evaluation harnesses ask) is named for its echo, not its logprobs.
        ("completions", {"echo": True, "logprobs": 1, "max_tokens": 0}, R.ECHO),
        ("chat", {"prompt_logprobs": 1, "logprobs": True}, R.PROMPT_LOGPROBS),
        ("completions", {"suffix": "}\n"}, R.SUFFIX),
        ("chat", {"logit_bias": {"50256": -100}}, R.LOGIT_BIAS),
        ("chat", {"presence_penalty": 0.5}, R.PRESENCE_PENALTY),
        ("chat", {"frequency_penalty": -0.1}, R.FREQUENCY_PENALTY),
        ("chat", {"repetition_penalty": 1.1}, R.REPETITION_PENALTY),
        ("chat", {"min_tokens": 5}, R.MIN_TOKENS),
        ("chat", {"ignore_eos": True}, R.IGNORE_EOS),
        ("chat", {"guided_json": {"type": "object"}}, R.GUIDED_JSON),
        ("chat", {"guided_regex": "[0-9]+"}, R.GUIDED_REGEX),
        ("chat", {"guided_choice": ["yes", "no"]}, R.GUIDED_CHOICE),
        ("completions", {"guided_grammar": "root ::= 'a'"}, R.GUIDED_GRAMMAR),
        ("chat", {"structured_outputs": {"regex": "a"}}, R.STRUCTURED_OUTPUTS),
        ("chat", {"response_format": {"type": "json_object"}}, R.RESPONSE_FORMAT),
        (
            "chat",
            {"response_format": {"type": "json_schema", "json_schema": {}}},
            R.RESPONSE_FORMAT,
        ),
        ("chat", {"tool_choice": "required"}, R.TOOL_CHOICE),
        ("chat", {"seed": 1}, R.SEED),
        ("chat", {"seed": 1, "temperature": 0.7}, R.SEED),
        ("chat", {"min_p": 0.1}, R.MIN_P),
        ("completions", {"bad_words": ["x"]}, R.BAD_WORDS),
        ("chat", {"allowed_token_ids": [1, 2]}, R.ALLOWED_TOKEN_IDS),
        ("chat", {"logprob_token_ids": [3]}, R.LOGPROB_TOKEN_IDS),
        ("chat", {"skip_special_tokens": False}, R.SKIP_SPECIAL_TOKENS),
        ("chat", {"regex": "[a-z]+"}, R.REGEX),
        ("completions", {"ebnf": "root ::= 'a'"}, R.EBNF),
        (
            "chat",
            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
            R.TOOL_CHOICE,
        ),
        # a Responses request, as the chat request it translates to
        ("responses", {"previous_response_id": "resp_1"}, R.PREVIOUS_RESPONSE_ID),
        ("responses", {"conversation": "conv_1"}, R.CONVERSATION),
        ("responses", {"background": True}, R.BACKGROUND),
        ("responses", {"store": True}, R.STORE),
        ("responses", {"hosted_tools": ["web_search"]}, R.HOSTED_TOOLS),
        ("responses", {"logprobs": True}, R.LOGPROBS),
        # malformed values are not neutral: the throughput server validates them
        ("chat", {"n": "2"}, R.N),
        ("chat", {"presence_penalty": "0"}, R.PRESENCE_PENALTY),
        ("chat", {"tool_choice": "sometimes"}, R.TOOL_CHOICE),
    ],
)
def test_each_unsupported_field_reroutes(
    endpoint: Endpoint, body: dict[str, Any], reason: RerouteReason
) -> None:
    decision = decide(body, endpoint)
    assert decision.path == "throughput"
    assert decision.reroute_reason is reason
    assert decision.rule_path == "latency"
    assert decision.unavailable is None


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("chat", {}),
        ("chat", {"n": 1, "best_of": 1, "use_beam_search": False}),
        ("chat", {"logprobs": False, "top_logprobs": 0}),
        ("chat", {"logprobs": None, "prompt_logprobs": None}),
        ("completions", {"echo": False, "suffix": "", "logprobs": None}),
        ("chat", {"logit_bias": {}}),
        ("chat", {"presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1}),
        ("chat", {"repetition_penalty": 1.0, "min_tokens": 0, "ignore_eos": False}),
        ("chat", {"response_format": {"type": "text"}}),
        ("chat", {"tool_choice": "auto"}),
        ("chat", {"tool_choice": "none"}),
        ("chat", {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "stop": ["\n"]}),
        ("chat", {"temperature": 0, "seed": 1}),
        ("chat", {"min_p": 0, "bad_words": [], "skip_special_tokens": True}),
        ("completions", {"prompt": [1, 2, 3]}),
        ("completions", {"prompt": ["only one"]}),
        ("responses", {"store": False, "background": False, "tools": []}),
        ("chat", {"store": True}),  # chat's `store` is not vLLM's to honour either way
    ],
)
def test_neutral_values_stay_on_latency(endpoint: Endpoint, body: dict[str, Any]) -> None:
    decision = decide(body, endpoint)
    assert (decision.path, decision.reroute_reason) == ("latency", None)


def test_the_first_reason_is_recorded() -> None:
    assert decide({"n": 2, "logprobs": True}).reroute_reason is R.N


@pytest.mark.parametrize(
    ("max_tokens", "tokens", "path"),
    [
        (None, 999, "latency"),  # unset budget: one token of room is enough
        (None, 1000, "throughput"),
        (500, 500, "latency"),
        (500, 501, "throughput"),
        (1, 999, "latency"),
        (2000, 1, "throughput"),
    ],
)
def test_context_length(max_tokens: int | None, tokens: int, path: str) -> None:
    decision = decide({"max_tokens": max_tokens}, tokens=tokens)
    assert decision.path == path
    expected = R.CONTEXT_LENGTH if path == "throughput" else None
    assert decision.reroute_reason is expected


def test_no_context_limit_known() -> None:
    assert decide({"max_tokens": 10**6}, model="latency-only", tokens=10**6).path == "latency"


@pytest.mark.parametrize(
    ("model", "body", "rule_path", "path", "reason", "unavailable"),
    [
        ("throughput-only", {}, "latency", "throughput", R.NO_LATENCY_POOL, None),
        ("latency-only", {"n": 2}, "latency", "throughput", R.N, NO_THROUGHPUT_PATH),
        ("latency-only", {}, "throughput", "throughput", None, NO_THROUGHPUT_PATH),
        ("unknown", {}, "latency", "throughput", R.NO_LATENCY_POOL, NO_THROUGHPUT_PATH),
        ("unknown", {}, "throughput", "throughput", None, NO_THROUGHPUT_PATH),
        ("both", {"n": 2}, "throughput", "throughput", None, None),
    ],
)
def test_models_without_a_path(
    model: str,
    body: dict[str, Any],
    rule_path: str,
    path: str,
    reason: RerouteReason | None,
    unavailable: str | None,
) -> None:
    rules = parse_rules({"default": {"path": rule_path}})
    features = features_from_request(
        {"model": model, "messages": [], **body}, endpoint="chat", headers={}, api_key_name=None
    )
    decision = classify(features, rules, CAPABILITIES)
    assert decision.rule_path == rule_path
    assert (decision.path, decision.reroute_reason, decision.unavailable) == (
        path,
        reason,
        unavailable,
    )


def test_no_latency_pool_takes_precedence_over_request_fields() -> None:
    decision = decide({"n": 2}, model="throughput-only")
    assert decision.reroute_reason is R.NO_LATENCY_POOL


ALL_FEATURES = frozenset({"logprobs", "grammar", "penalties", "ignore_eos"})


def decide_with(features: frozenset[str], body: dict[str, Any], endpoint: Endpoint) -> Any:
    model = ModelCapabilities(has_latency_pool=True, has_throughput=True, latency_features=features)
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    request = features_from_request(
        {**base, **body}, endpoint=endpoint, headers={}, api_key_name=None
    )
    request.prompt_tokens = 10
    return classify(request, LATENCY_FOR_ALL, Capabilities({"m": model}))


@pytest.mark.parametrize(
    ("endpoint", "body", "feature", "reason"),
    [
        ("chat", {"logprobs": True}, "logprobs", R.LOGPROBS),
        ("chat", {"logprobs": True, "top_logprobs": 5}, "logprobs", R.LOGPROBS),
        ("completions", {"logprobs": 0}, "logprobs", R.LOGPROBS),
        ("completions", {"logprobs": 5}, "logprobs", R.LOGPROBS),
        ("chat", {"response_format": {"type": "json_object"}}, "grammar", R.RESPONSE_FORMAT),
        (
            "chat",
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "grammar",
            R.RESPONSE_FORMAT,
        ),
        ("chat", {"repetition_penalty": 1.1}, "penalties", R.REPETITION_PENALTY),
        ("chat", {"presence_penalty": 0.5}, "penalties", R.PRESENCE_PENALTY),
        ("completions", {"ignore_eos": True}, "ignore_eos", R.IGNORE_EOS),
    ],
)
def test_a_field_stays_on_latency_while_every_node_reports_its_feature(
    endpoint: Endpoint, body: dict[str, Any], feature: str, reason: RerouteReason
) -> None:
    assert decide_with(ALL_FEATURES, body, endpoint).path == "latency"
    assert decide_with(frozenset({feature}), body, endpoint).path == "latency"
    without = decide_with(ALL_FEATURES - {feature}, body, endpoint)
    assert (without.path, without.reroute_reason) == ("throughput", reason)


@pytest.mark.parametrize(
    ("endpoint", "body", "reason"),
    [
        ("chat", {"logprobs": True, "top_logprobs": 6}, R.LOGPROBS),
        ("completions", {"logprobs": 6}, R.LOGPROBS),
        ("chat", {"logprobs": "yes"}, R.LOGPROBS),
        ("chat", {"response_format": {"type": "structural_tag"}}, R.RESPONSE_FORMAT),
        ("chat", {"frequency_penalty": 0.5}, R.FREQUENCY_PENALTY),
        ("chat", {"ignore_eos": "true"}, R.IGNORE_EOS),
    ],
)
def test_beyond_what_the_nodes_do_still_reroutes(
    endpoint: Endpoint, body: dict[str, Any], reason: RerouteReason
) -> None:
    decision = decide_with(ALL_FEATURES, body, endpoint)
    assert (decision.path, decision.reroute_reason) == ("throughput", reason)
