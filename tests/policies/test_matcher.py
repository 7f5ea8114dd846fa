"""Rule matching: each condition and operator, precedence, default, client route requests."""

from __future__ import annotations

from typing import Any

import pytest

from policies import (
    Capabilities,
    Decision,
    ModelCapabilities,
    RequestFeatures,
    classify,
    parse_rules,
)

CAPABILITIES = Capabilities({"glm-5": ModelCapabilities(True, True, max_seq_len=200_000)})


def features(**fields: Any) -> RequestFeatures:
    fields.setdefault("model", "glm-5")
    fields.setdefault("prompt_tokens", 100)
    return RequestFeatures(**fields)


def matches(match: dict[str, Any], request: RequestFeatures) -> bool:
    rules = parse_rules([{"name": "probe", "path": "latency", "match": match}])
    return classify(request, rules, CAPABILITIES).rule == "probe"


H = {"x-workload": "agent", "user-agent": "code-assist/1.4 (vscode)"}


@pytest.mark.parametrize(
    ("match", "request_fields", "expected"),
    [
        ({}, {}, True),
        # model: value, list, operators
        ({"model": "glm-5"}, {}, True),
        ({"model": "glm-4"}, {}, False),
        ({"model": ["glm-4", "glm-5"]}, {}, True),
        ({"model": {"prefix": "glm-"}}, {}, True),
        ({"model": {"regex": "^deepseek"}}, {}, False),
        # endpoint
        ({"endpoint": "chat"}, {"endpoint": "chat"}, True),
        ({"endpoint": "chat"}, {"endpoint": "completions"}, False),
        ({"endpoint": ["chat", "completions"]}, {"endpoint": "completions"}, True),
        # headers: exact, list, present, prefix, regex, several ANDed
        ({"headers": {"x-workload": "agent"}}, {"headers": H}, True),
        ({"headers": {"X-Workload": "agent"}}, {"headers": H}, True),
        ({"headers": {"x-workload": "Agent"}}, {"headers": H}, False),
        ({"headers": {"x-workload": "agent"}}, {}, False),
        ({"headers": {"x-workload": ["voice", "agent"]}}, {"headers": H}, True),
        ({"headers": {"x-workload": ["voice", "batch"]}}, {"headers": H}, False),
        ({"headers": {"x-workload": {"present": True}}}, {"headers": H}, True),
        ({"headers": {"x-workload": {"present": True}}}, {}, False),
        ({"headers": {"x-workload": {"present": False}}}, {}, True),
        ({"headers": {"x-workload": {"present": False}}}, {"headers": H}, False),
        ({"headers": {"user-agent": {"prefix": "code-assist/"}}}, {"headers": H}, True),
        ({"headers": {"user-agent": {"prefix": "curl/"}}}, {"headers": H}, False),
        ({"headers": {"user-agent": {"prefix": "code-assist/"}}}, {}, False),
        ({"headers": {"user-agent": {"regex": r"vscode\)$"}}}, {"headers": H}, True),
        ({"headers": {"user-agent": {"regex": "^vscode"}}}, {"headers": H}, False),
        ({"headers": {"user-agent": {"regex": "x"}}}, {}, False),
        ({"headers": {"x-workload": {"present": True, "prefix": "ag"}}}, {"headers": H}, True),
        ({"headers": {"x-workload": {"prefix": "ag", "regex": "z"}}}, {"headers": H}, False),
        ({"headers": {"x-workload": "agent", "x-tier": "gold"}}, {"headers": H}, False),
        ({"headers": {"x-tier": 1}}, {"headers": {"x-tier": "1"}}, True),
        # api_key_name, user
        ({"api_key_name": "team-a"}, {"api_key_name": "team-a"}, True),
        ({"api_key_name": "team-a"}, {"api_key_name": None}, False),
        ({"api_key_name": {"present": False}}, {"api_key_name": None}, True),
        ({"api_key_name": {"prefix": "premium-"}}, {"api_key_name": "premium-acme"}, True),
        ({"user": ["alice", "bob"]}, {"user": "bob"}, True),
        ({"user": {"regex": "^svc-"}}, {"user": "alice"}, False),
        # service_tier, as the client sent it
        ({"service_tier": "priority"}, {"service_tier": "priority"}, True),
        ({"service_tier": ["flex", "scale"]}, {"service_tier": "priority"}, False),
        ({"service_tier": "priority"}, {"service_tier": None}, False),
        ({"service_tier": {"present": False}}, {"service_tier": None}, True),
        # metadata: values compare as text, operators
        ({"metadata": {"workload": "eval"}}, {"metadata": {"workload": "eval"}}, True),
        ({"metadata": {"workload": "eval"}}, {"metadata": {}}, False),
        ({"metadata": {"tier": 2}}, {"metadata": {"tier": "2"}}, True),
        ({"metadata": {"tier": "2"}}, {"metadata": {"tier": 2}}, True),
        ({"metadata": {"urgent": True}}, {"metadata": {"urgent": "true"}}, True),
        ({"metadata": {"urgent": True}}, {"metadata": {"urgent": 1}}, False),
        ({"metadata": {"run": {"prefix": "nightly-"}}}, {"metadata": {"run": "nightly-7"}}, True),
        ({"metadata": {"run": {"present": False}}}, {"metadata": {"other": "x"}}, True),
        # stream, tools
        ({"stream": True}, {"stream": True}, True),
        ({"stream": True}, {"stream": False}, False),
        ({"stream": False}, {"stream": False}, True),
        ({"tools": True}, {"has_tools": True}, True),
        ({"tools": False}, {"has_tools": True}, False),
        # max_tokens: inclusive; unset counts as unbounded
        ({"max_tokens": {"max": 1024}}, {"max_tokens": 1024}, True),
        ({"max_tokens": {"max": 1024}}, {"max_tokens": 1025}, False),
        ({"max_tokens": {"max": 1024}}, {"max_tokens": None}, False),
        ({"max_tokens": {"min": 8192}}, {"max_tokens": None}, True),
        ({"max_tokens": {"min": 8192}}, {"max_tokens": 8191}, False),
        ({"max_tokens": {"min": 10, "max": 20}}, {"max_tokens": 10}, True),
        ({"max_tokens": {"min": 10, "max": 20}}, {"max_tokens": 21}, False),
        # prompt_tokens: inclusive
        ({"prompt_tokens": {"min": 100}}, {"prompt_tokens": 100}, True),
        ({"prompt_tokens": {"min": 101}}, {"prompt_tokens": 100}, False),
        ({"prompt_tokens": {"max": 100}}, {"prompt_tokens": 100}, True),
        ({"prompt_tokens": {"max": 99}}, {"prompt_tokens": 100}, False),
        ({"prompt_tokens": {"min": 50, "max": 150}}, {"prompt_tokens": 100}, True),
        # everything ANDed
        (
            {"model": "glm-5", "stream": True, "tools": True, "headers": {"x-workload": "agent"}},
            {"stream": True, "has_tools": True, "headers": H},
            True,
        ),
        (
            {"model": "glm-5", "stream": True, "tools": True, "headers": {"x-workload": "agent"}},
            {"stream": True, "has_tools": False, "headers": H},
            False,
        ),
    ],
)
def test_conditions(match: dict[str, Any], request_fields: dict[str, Any], expected: bool) -> None:
    assert matches(match, features(**request_fields)) is expected


ORDERED = parse_rules(
    {
        "default": {"name": "fallback", "path": "throughput", "priority": -1},
        "rules": [
            {"name": "batch", "path": "throughput", "match": {"headers": {"x-workload": "batch"}}},
            {
                "name": "agents",
                "path": "latency",
                "priority": 10,
                "on_saturation": "spill",
                "max_queue_wait_ms": 250,
                "match": {"headers": {"x-workload": {"prefix": "agent"}}},
            },
            {
                "name": "streams",
                "path": "latency",
                "priority": 5,
                "on_saturation": "reject",
                "match": {"stream": True},
            },
        ],
    }
)


@pytest.mark.parametrize(
    ("request_fields", "rule", "path", "priority", "on_saturation", "wait"),
    [
        (
            {"headers": {"x-workload": "batch"}, "stream": True},
            "batch",
            "throughput",
            0,
            "queue",
            None,
        ),
        (
            {"headers": {"x-workload": "agent"}, "stream": True},
            "agents",
            "latency",
            10,
            "spill",
            250,
        ),
        (
            {"headers": {"x-workload": "other"}, "stream": True},
            "streams",
            "latency",
            5,
            "reject",
            None,
        ),
        ({"headers": {"x-workload": "other"}}, "fallback", "throughput", -1, "queue", None),
        ({}, "fallback", "throughput", -1, "queue", None),
    ],
)
def test_first_match_wins_then_default(
    request_fields: dict[str, Any],
    rule: str,
    path: str,
    priority: int,
    on_saturation: str,
    wait: int | None,
) -> None:
    decision = classify(features(**request_fields), ORDERED, CAPABILITIES)
    assert decision == Decision(
        path=path,  # type: ignore[arg-type]
        rule=rule,
        priority=priority,
        on_saturation=on_saturation,  # type: ignore[arg-type]
        max_queue_wait_ms=wait,
        rule_path=path,  # type: ignore[arg-type]
    )


ROUTABLE = parse_rules(
    {
        "default": {"name": "closed", "path": "throughput"},
        "rules": [
            {
                "name": "open",
                "path": "latency",
                "allow_client_route": ["latency", "throughput"],
                "match": {"user": "open"},
            },
            {
                "name": "to-latency",
                "path": "throughput",
                "allow_client_route": ["latency"],
                "match": {"user": "up"},
            },
        ],
    }
)


@pytest.mark.parametrize(
    ("user", "header", "body_fields", "path", "honoured", "reason"),
    [
        ("open", None, {}, "latency", False, None),
        ("open", "throughput", {}, "throughput", True, None),
        ("open", " Latency ", {}, "latency", True, None),
        ("up", "latency", {}, "latency", True, None),
        ("up", "throughput", {}, "throughput", False, None),  # not allowed: rule's path anyway
        ("nobody", "latency", {}, "throughput", False, None),  # default allows nothing
        ("open", "fastest", {}, "latency", False, None),  # not a path
        # a forced latency route still passes the guard
        ("up", "latency", {"n": 4}, "throughput", True, "n"),
    ],
)
def test_client_route_requests(
    user: str,
    header: str | None,
    body_fields: dict[str, Any],
    path: str,
    honoured: bool,
    reason: str | None,
) -> None:
    request = features(user=user, headers={} if header is None else {"x-pd-route": header})
    request.options.n = body_fields.get("n")
    decision = classify(request, ROUTABLE, CAPABILITIES)
    assert decision.path == path
    assert decision.client_route_honoured is honoured
    assert decision.client_route == header
    assert decision.reroute_reason == reason


@pytest.mark.parametrize(
    ("match", "tenant", "expected"),
    [
        ({"tenant": "acme"}, "acme", True),
        ({"tenant": {"prefix": "team-"}}, "team-7", True),
        ({"tenant": "acme"}, "default", False),
        ({"tenant": {"present": False}}, None, True),
    ],
)
def test_a_rule_matches_a_tenant_as_it_matches_a_key(
    match: dict[str, Any], tenant: str | None, expected: bool
) -> None:
    assert matches(match, features(tenant=tenant)) is expected
