"""The example rules files under policies/examples, each against a table of requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import policies
from policies import (
    Capabilities,
    Decision,
    ModelCapabilities,
    RuleSet,
    classify,
    features_from_request,
    load_rules,
    needs_prompt_tokens,
)

EXAMPLES = Path(policies.__file__).with_name("examples")
CAPS = Capabilities({"glm-5": ModelCapabilities(True, True, max_seq_len=131_072)})
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]


def route(
    rules: RuleSet,
    *,
    headers: dict[str, str] | None = None,
    key: str | None = None,
    prompt_bytes: int = 200,
    tokens: int = 50,
    counted: bool = False,
    **body: Any,
) -> Decision:
    """Classify a chat request whose prompt has `prompt_bytes` bytes and `tokens` tokens;
    check that the count is asked for exactly when `counted` says so."""
    request = {
        "model": "glm-5",
        "messages": [{"role": "user", "content": "x" * prompt_bytes}],
        **body,
    }
    features = features_from_request(
        request, endpoint="chat", headers=headers or {}, api_key_name=key
    )
    assert needs_prompt_tokens(features, rules, CAPS) is counted
    if counted:
        features.prompt_tokens = tokens
    return classify(features, rules, CAPS)


def test_every_example_loads() -> None:
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert [f.name for f in files] == [
        "api-key-tiers.yaml",
        "interactive.yaml",
        "latency-first.yaml",
        "objectives.yaml",
    ]
    for file in files:
        assert load_rules(file).rules


INTERACTIVE = load_rules(EXAMPLES / "interactive.yaml")
H_AGENT = {"x-workload": "agent"}
CODE = {"user-agent": "code-assist/2.1 (jetbrains)"}
CODING = {"stream": True, "tools": TOOLS, "max_tokens": 4096}


@pytest.mark.parametrize(
    ("request_args", "rule", "path", "priority", "reason"),
    [
        ({"headers": {"x-workload": "batch"}}, "batch", "throughput", 0, None),
        ({"headers": {"x-workload": "backfill"}, "stream": True}, "batch", "throughput", 0, None),
        ({"metadata": {"workload": "eval"}}, "evals", "throughput", 0, None),
        ({"headers": {"x-workload": "voice"}, "stream": True}, "voice", "latency", 100, None),
        ({"headers": {"x-workload": "voice"}}, "default", "throughput", 0, None),
        ({"headers": {"x-workload": "agent"}}, "agents", "latency", 50, None),
        ({"headers": {"x-workload": "agent-planner"}}, "agents", "latency", 50, None),
        ({"headers": {"x-workload": "agents"}}, "default", "throughput", 0, None),
        (
            {"headers": {"x-workload": "agent"}, "logprobs": True},
            "agents",
            "throughput",
            50,
            "logprobs",
        ),
        (
            {"headers": {"x-workload": "agent", "x-pd-route": "throughput"}},
            "agents",
            "throughput",
            50,
            None,
        ),
        # long prompts: decided by bounds when small or huge, counted in between
        (
            {"headers": H_AGENT, "prompt_bytes": 300_000, "tokens": 70_000, "counted": True},
            "long-prompts",
            "throughput",
            0,
            None,
        ),
        (
            {"headers": H_AGENT, "prompt_bytes": 300_000, "tokens": 60_000, "counted": True},
            "agents",
            "latency",
            50,
            None,
        ),
        (
            {"headers": {"x-workload": "agent"}, "prompt_bytes": 10_000_000},
            "long-prompts",
            "throughput",
            0,
            None,
        ),
        # prompt + max_tokens beyond the pool's 128k context
        (
            {
                "headers": H_AGENT,
                "prompt_bytes": 200_000,
                "tokens": 60_000,
                "max_tokens": 80_000,
                "counted": True,
            },
            "agents",
            "throughput",
            50,
            "context_length",
        ),
        ({"headers": CODE, **CODING}, "coding", "latency", 30, None),
        ({"headers": CODE, **CODING, "max_tokens": None}, "default", "throughput", 0, None),
        ({"headers": CODE, **CODING, "tools": None}, "default", "throughput", 0, None),
        (
            {"headers": {**CODE, "x-pd-route": "throughput"}, **CODING},
            "coding",
            "throughput",
            30,
            None,
        ),
        (
            {"headers": CODE, **CODING, "tool_choice": "required"},
            "coding",
            "throughput",
            30,
            "tool_choice",
        ),
        ({}, "default", "throughput", 0, None),
    ],
)
def test_interactive(
    request_args: dict[str, Any], rule: str, path: str, priority: int, reason: str | None
) -> None:
    decision = route(INTERACTIVE, **request_args)
    assert (decision.rule, decision.path, decision.priority, decision.reroute_reason) == (
        rule,
        path,
        priority,
        reason,
    )


TIERS = load_rules(EXAMPLES / "api-key-tiers.yaml")


@pytest.mark.parametrize(
    ("request_args", "rule", "path", "on_saturation", "honoured"),
    [
        ({"key": "eval-harness"}, "internal-evals", "throughput", "queue", False),
        ({"key": "premium-acme"}, "premium", "latency", "queue", False),
        (
            {"key": "premium-acme", "headers": {"x-pd-route": "throughput"}},
            "premium",
            "throughput",
            "queue",
            True,
        ),
        ({"key": "pro-initech", "max_tokens": 1024}, "pro", "latency", "spill", False),
        ({"key": "pro-initech", "max_tokens": 8192}, "standard", "throughput", "queue", False),
        ({"key": "pro-initech"}, "standard", "throughput", "queue", False),
        (
            {"key": "pro-initech", "max_tokens": 1024, "prompt_bytes": 40_000, "tokens": 9_000},
            "pro",
            "latency",
            "spill",
            False,
        ),
        (
            {"key": "pro-initech", "max_tokens": 1024, "prompt_bytes": 200_000, "tokens": 40_000},
            "standard",
            "throughput",
            "queue",
            False,
        ),
        ({"key": None}, "anonymous", "throughput", "queue", False),
        (
            {"key": None, "headers": {"x-pd-route": "latency"}},
            "anonymous",
            "throughput",
            "queue",
            False,
        ),
        ({"key": "acme"}, "standard", "throughput", "queue", False),
    ],
)
def test_api_key_tiers(
    request_args: dict[str, Any], rule: str, path: str, on_saturation: str, honoured: bool
) -> None:
    counted = request_args.get("prompt_bytes", 0) > 30_000
    decision = route(TIERS, counted=counted, **request_args)
    assert (decision.rule, decision.path, decision.on_saturation) == (rule, path, on_saturation)
    assert decision.client_route_honoured is honoured


LATENCY_FIRST = load_rules(EXAMPLES / "latency-first.yaml")


@pytest.mark.parametrize(
    ("request_args", "rule", "path", "reason", "counted"),
    [
        ({"stream": True}, "interactive", "latency", None, False),
        ({"headers": {"x-priority": "batch"}}, "batch", "throughput", None, False),
        (
            {"headers": {"x-priority": "batch", "x-pd-route": "latency"}},
            "batch",
            "latency",
            None,
            False,
        ),
        ({"max_tokens": 10_000}, "long-generations", "throughput", None, False),
        ({"max_tokens": 10_000, "stream": True}, "interactive", "latency", None, False),
        ({"max_tokens": None}, "long-generations", "throughput", None, False),
        ({"prompt_bytes": 20_000_000, "stream": True}, "over-context", "throughput", None, False),
        (
            {"prompt_bytes": 600_000, "tokens": 140_000, "stream": True},
            "over-context",
            "throughput",
            None,
            True,
        ),
        (
            {"prompt_bytes": 600_000, "tokens": 130_000, "stream": True, "max_tokens": 2000},
            "interactive",
            "throughput",
            "context_length",
            True,
        ),
        (
            {"prompt_bytes": 600_000, "tokens": 100_000, "stream": True, "max_tokens": 2000},
            "interactive",
            "latency",
            None,
            True,
        ),
    ],
)
def test_latency_first(
    request_args: dict[str, Any], rule: str, path: str, reason: str | None, counted: bool
) -> None:
    decision = route(LATENCY_FIRST, counted=counted, **request_args)
    assert (decision.rule, decision.path, decision.reroute_reason) == (rule, path, reason)


OBJECTIVES = load_rules(EXAMPLES / "objectives.yaml")


def test_objectives_example() -> None:
    voice = route(OBJECTIVES, headers={"x-workload": "voice"})
    assert voice.objective == policies.Objective(300, 15)
    assert (voice.on_miss, voice.priority) == ("queue", 20)
    chat = route(OBJECTIVES, headers={"x-workload": "chat", "x-pd-objective-ttft-ms": "100"})
    assert chat.objective == policies.Objective(300, 40)  # the rule's floor
    assert chat.ways == ("whole", "split", "tilert")
    agent = route(OBJECTIVES, headers={"x-workload": "agent-3"})
    assert (agent.ways, agent.on_miss) == (("whole", "tilert"), "reject")
    batch = route(OBJECTIVES, headers={"x-workload": "batch"})
    assert (batch.objective, batch.path) == (None, "throughput")
