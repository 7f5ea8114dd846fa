"""The Decision's response headers and its human-readable explanation."""

from __future__ import annotations

import pytest

from policies import (
    Capabilities,
    Decision,
    ModelCapabilities,
    RequestFeatures,
    RerouteReason,
    classify,
    parse_rules,
)

RULES = parse_rules(
    [
        {"name": "batch", "path": "throughput", "match": {"headers": {"x-workload": "batch"}}},
        {
            "name": "agents",
            "path": "latency",
            "priority": 10,
            "on_saturation": "spill",
            "max_queue_wait_ms": 250,
            "match": {"headers": {"x-workload": "agent"}, "prompt_tokens": {"max": 50_000}},
        },
    ]
)
CAPS = Capabilities({"glm-5": ModelCapabilities(True, False, max_seq_len=100_000)})


def agent_request(**fields: object) -> RequestFeatures:
    return RequestFeatures(
        model="glm-5", headers={"x-workload": "agent"}, prompt_bytes=2_000, **fields
    )


@pytest.mark.parametrize(
    ("decision", "headers"),
    [
        (
            Decision("latency", "agents", 10, "spill", 250),
            {"x-pd-route": "latency", "x-pd-rule": "agents"},
        ),
        (
            Decision("throughput", "agents", 10, "spill", 250, RerouteReason.LOGIT_BIAS),
            {
                "x-pd-route": "throughput",
                "x-pd-rule": "agents",
                "x-pd-reroute-reason": "logit_bias",
            },
        ),
    ],
)
def test_response_headers(decision: Decision, headers: dict[str, str]) -> None:
    assert decision.response_headers() == headers


def test_explain_a_match_decided_by_bounds() -> None:
    text = classify(agent_request(), RULES, CAPS).explain()
    assert text.splitlines() == [
        "request: model 'glm-5', chat, no stream, 2000 prompt bytes (16..3056 tokens),"
        " max_tokens unset",
        "rule 'batch' skipped: headers.x-workload = 'agent', wanted is 'batch'",
        "rule 'agents' matched:",
        "  headers.x-workload = 'agent', wanted is 'agent'",
        "  prompt_tokens = not counted, between 16 and 3056, wanted <= 50000",
        "action: path latency, priority 10, on_saturation spill, max_queue_wait_ms 250",
        "guard: passed",
        "result: latency",
    ]


def test_explain_a_reroute_the_client_route_and_a_missing_path() -> None:
    features = agent_request(prompt_tokens=60_000)
    features.headers = {**features.headers, "x-pd-route": "latency"}
    features.options.logprobs = True
    decision = classify(features, RULES, CAPS)
    lines = decision.explain().splitlines()
    assert lines[0].endswith("60000 prompt tokens, max_tokens unset")
    assert "rule 'agents' skipped: prompt_tokens = 60000, wanted <= 50000" in lines
    assert "no rule matched: default" in lines
    assert "client route: x-pd-route: 'latency' ignored (not allowed)" in lines
    assert lines[-1] == "result: throughput, unavailable (no_throughput_path)"


def test_explain_a_guard_reroute() -> None:
    features = agent_request()
    features.options.n = 3
    lines = classify(features, RULES, CAPS).explain().splitlines()
    assert "guard: re-routed to throughput (n)" in lines


def test_explain_without_a_trace() -> None:
    text = Decision("latency", "agents", 10, "spill", 250, rule_path="latency").explain()
    assert text.splitlines()[-1] == "result: latency"


def test_explain_a_rule_without_conditions() -> None:
    rules = parse_rules([{"name": "everything", "path": "latency"}])
    text = classify(agent_request(), rules, CAPS).explain()
    assert "rule 'everything' matched: it has no conditions" in text


def test_the_trace_does_not_affect_equality() -> None:
    first = classify(agent_request(), RULES, CAPS)
    again = classify(agent_request(prompt_tokens=40_000), RULES, CAPS)
    assert first == again
    assert first.explain() != again.explain()
