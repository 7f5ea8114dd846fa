"""needs_prompt_tokens: the count is asked for exactly when the cheap bounds cannot decide."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import (
    Capabilities,
    Decision,
    ModelCapabilities,
    PromptTokensRequired,
    RequestFeatures,
    RuleSet,
    TokenBounds,
    classify,
    needs_prompt_tokens,
    parse_rules,
)

# Default bounds: low = ceil(bytes / 128), high = bytes + 1024 + 32 per item.
SMALL, LARGE, HUGE = 1_000, 100_000, 30_000_000
CAPS = Capabilities({"m": ModelCapabilities(True, True, max_seq_len=200_000)})
NO_LIMIT = Capabilities({"m": ModelCapabilities(True, True)})


def rules(*specs: dict[str, Any], default: str = "throughput") -> RuleSet:
    named = [{"name": f"r{i}", **spec} for i, spec in enumerate(specs)]
    return parse_rules({"rules": named, "default": {"path": default}})


def request(prompt_bytes: int, **fields: Any) -> RequestFeatures:
    return RequestFeatures(model="m", prompt_bytes=prompt_bytes, **fields)


LONG_TO_THROUGHPUT = {"path": "throughput", "match": {"prompt_tokens": {"min": 65_536}}}
SHORT_TO_LATENCY = {"path": "latency", "match": {"prompt_tokens": {"max": 100}}}
AGENTS = {"path": "latency", "match": {"headers": {"x-workload": "agent"}}}
AGENTS_LONG = {
    "path": "throughput",
    "match": {"headers": {"x-workload": "agent"}, "prompt_tokens": {"min": 65_536}},
}


@pytest.mark.parametrize(
    ("ruleset", "caps", "features", "needed"),
    [
        # no rule looks at the count, no context limit
        (rules(AGENTS), NO_LIMIT, request(HUGE), False),
        (rules(AGENTS, default="latency"), NO_LIMIT, request(HUGE), False),
        # a bound decides the range
        (rules(LONG_TO_THROUGHPUT), NO_LIMIT, request(SMALL), False),
        (rules(LONG_TO_THROUGHPUT), NO_LIMIT, request(HUGE), False),
        (rules(SHORT_TO_LATENCY), NO_LIMIT, request(LARGE), False),
        # undecided
        (rules(LONG_TO_THROUGHPUT), NO_LIMIT, request(LARGE), True),
        (rules(SHORT_TO_LATENCY), NO_LIMIT, request(SMALL), True),
        (rules(LONG_TO_THROUGHPUT), NO_LIMIT, request(SMALL, prompt_opaque=True), True),
        # a cheap condition already rules the rule out
        (rules(AGENTS_LONG), NO_LIMIT, request(LARGE), False),
        (rules(AGENTS_LONG), NO_LIMIT, request(LARGE, headers={"x-workload": "agent"}), True),
        # a decisive match comes first
        (
            rules(AGENTS, LONG_TO_THROUGHPUT),
            NO_LIMIT,
            request(LARGE, headers={"x-workload": "agent"}),
            False,
        ),
        (rules(AGENTS, LONG_TO_THROUGHPUT), NO_LIMIT, request(LARGE), True),
        # the count is known
        (rules(LONG_TO_THROUGHPUT), CAPS, request(LARGE, prompt_tokens=70_000), False),
        # the guard's context check: max_seq_len 200k
        (rules(default="latency"), CAPS, request(SMALL), False),
        (rules(default="latency"), CAPS, request(HUGE), False),
        (rules(default="latency"), CAPS, request(300_000), True),
        (rules(default="latency"), CAPS, request(300_000, prompt_opaque=True), True),
        (rules(default="latency"), CAPS, request(SMALL, max_tokens=199_000), True),
        (rules(default="latency"), CAPS, request(SMALL, max_tokens=100_000), False),
        # ... only matters on the latency path and when nothing else re-routes first
        (rules(default="throughput"), CAPS, request(300_000), False),
        (rules(default="latency"), CAPS, request(300_000, headers={"x-pd-route": "latency"}), True),
    ],
)
def test_needs_prompt_tokens(
    ruleset: RuleSet, caps: Capabilities, features: RequestFeatures, needed: bool
) -> None:
    assert needs_prompt_tokens(features, ruleset, caps) is needed
    if needed:
        with pytest.raises(PromptTokensRequired):
            classify(features, ruleset, caps)
    else:
        assert classify(features, ruleset, caps).rule


def test_another_reroute_makes_the_context_check_moot() -> None:
    features = request(300_000)
    features.options.n = 2
    assert not needs_prompt_tokens(features, rules(default="latency"), CAPS)
    assert classify(features, rules(default="latency"), CAPS).reroute_reason == "n"


def test_the_count_completes_the_decision() -> None:
    ruleset = rules(LONG_TO_THROUGHPUT, default="latency")
    features = request(LARGE)
    assert needs_prompt_tokens(features, ruleset, CAPS)
    features.prompt_tokens = 70_000
    assert not needs_prompt_tokens(features, ruleset, CAPS)
    assert classify(features, ruleset, CAPS).rule == "r0"
    features.prompt_tokens = 20_000
    assert classify(features, ruleset, CAPS).path == "latency"


# Tight bounds so that the property tests see decided and undecided cases alike.
TIGHT = TokenBounds(max_bytes_per_token=4, overhead_tokens=16, overhead_tokens_per_item=4)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[RuleSet, Capabilities, RequestFeatures]:
    specs = []
    for _ in range(draw(st.integers(0, 4))):
        match: dict[str, Any] = {}
        if draw(st.booleans()):
            match["headers"] = {"x-w": draw(st.sampled_from(["a", "b"]))}
        if draw(st.booleans()):
            low = draw(st.none() | st.integers(0, 3000))
            high = draw(st.none() | st.integers(low or 0, 4000))
            if low is not None or high is not None:
                match["prompt_tokens"] = {"min": low, "max": high}
        path = draw(st.sampled_from(["latency", "throughput"]))
        specs.append({"path": path, "match": match})
    ruleset = rules(*specs, default=draw(st.sampled_from(["latency", "throughput"])))
    limit = draw(st.none() | st.integers(100, 4000))
    caps = Capabilities({"m": ModelCapabilities(True, True, max_seq_len=limit)}, bounds=TIGHT)
    features = request(
        draw(st.integers(0, 4000)),
        prompt_items=draw(st.integers(1, 5)),
        prompt_opaque=draw(st.booleans()),
        max_tokens=draw(st.none() | st.integers(1, 3000)),
        headers={"x-w": draw(st.sampled_from(["a", "b", "c"]))},
    )
    return ruleset, caps, features


def with_count(features: RequestFeatures, count: int) -> RequestFeatures:
    counted = copy.copy(features)
    counted.prompt_tokens = count
    return counted


def candidate_counts(ruleset: RuleSet, caps: Capabilities, features: RequestFeatures) -> set[int]:
    """Counts consistent with the bounds, including every boundary a decision turns on."""
    bounds = TIGHT.estimate(features)
    high = bounds.high if bounds.high is not None else 10_000
    edges = {bounds.low, high, (bounds.low + high) // 2}
    for rule in ruleset.rules:
        if rule.prompt_tokens is not None:
            for edge in (rule.prompt_tokens.range.min, rule.prompt_tokens.range.max):
                if edge is not None:
                    edges |= {edge - 1, edge, edge + 1}
    limit = caps.for_model("m").max_seq_len
    if limit is not None:
        budget = features.max_tokens or 1
        edges |= {limit - budget, limit - budget + 1}
    return {count for count in edges if bounds.low <= count <= high}


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_a_decision_without_the_count_holds_for_every_consistent_count(
    scenario: tuple[RuleSet, Capabilities, RequestFeatures],
) -> None:
    ruleset, caps, features = scenario
    counts = candidate_counts(ruleset, caps, features)
    outcomes: list[Decision] = []
    for count in sorted(counts):
        counted = with_count(features, count)
        assert not needs_prompt_tokens(counted, ruleset, caps)
        outcomes.append(classify(counted, ruleset, caps))
    if needs_prompt_tokens(features, ruleset, caps):
        # asked for only when it matters: some consistent counts decide differently
        assert any(outcome != outcomes[0] for outcome in outcomes)
    else:
        decision = classify(features, ruleset, caps)
        assert all(outcome == decision for outcome in outcomes)
