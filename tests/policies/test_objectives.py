"""Rules with an objective: validation, the ways the guard and the model leave, and a
client's tightening within the rule's floor."""

from __future__ import annotations

from typing import Any

import pytest

from policies import (
    Capabilities,
    ClientObjectiveError,
    DecodingOptions,
    ModelCapabilities,
    Objective,
    RequestFeatures,
    RulesError,
    classify,
    parse_rules,
)

BOTH = Capabilities({"glm-5": ModelCapabilities(True, True, max_seq_len=200_000)})
NATIVE_ONLY = Capabilities({"glm-5": ModelCapabilities(False, True, max_seq_len=200_000)})
NODES_ONLY = Capabilities({"glm-5": ModelCapabilities(True, False, max_seq_len=200_000)})


def features(**fields: Any) -> RequestFeatures:
    fields.setdefault("model", "glm-5")
    fields.setdefault("prompt_tokens", 100)
    return RequestFeatures(**fields)


def rules(**action: Any) -> Any:
    return parse_rules([{"name": "chat", "objective": {"ttft_ms": 800, "itl_ms": 30}, **action}])


def test_an_objective_rule_decides_the_objective_and_its_ways_cheapest_first() -> None:
    decision = classify(features(), rules(), BOTH)
    assert decision.objective == Objective(800, 30)
    assert decision.ways == ("whole", "split", "tilert")
    assert decision.on_miss == "best"
    assert decision.path == "latency"  # the guard checked the node way
    assert decision.response_headers()["x-pd-objective"] == "ttft_ms=800; itl_ms=30"
    assert "objective ttft_ms=800; itl_ms=30, ways whole, split, tilert" in decision.explain()


def test_the_rule_orders_and_limits_the_ways() -> None:
    decision = classify(features(), rules(ways=["split", "whole"], on_miss="reject"), BOTH)
    assert decision.ways == ("split", "whole")
    assert decision.path == "throughput"
    assert decision.on_miss == "reject"


def test_a_request_the_node_cannot_honour_keeps_only_the_native_ways() -> None:
    request = features(options=DecodingOptions(n=2))
    decision = classify(request, rules(), BOTH)
    assert decision.ways == ("whole", "split")
    assert decision.reroute_reason is not None and decision.reroute_reason.value == "n"


def test_the_model_s_paths_bound_the_ways() -> None:
    assert classify(features(), rules(), NATIVE_ONLY).ways == ("whole", "split")
    assert classify(features(), rules(), NODES_ONLY).ways == ("tilert",)


def test_no_way_left_is_a_fixed_path() -> None:
    decision = classify(features(options=DecodingOptions(n=2)), rules(ways=["tilert"]), BOTH)
    assert decision.objective is None
    assert decision.path == "throughput"


def test_an_honoured_client_route_replaces_the_objective() -> None:
    request = features(headers={"x-pd-route": "throughput"})
    decision = classify(request, rules(allow_client_route=["throughput"]), BOTH)
    assert decision.objective is None
    assert decision.path == "throughput"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, Objective(800, 30)),
        ({"x-pd-objective-ttft-ms": "500"}, Objective(500, 30)),
        ({"x-pd-objective-ttft-ms": "50"}, Objective(200, 30)),  # not below the floor
        ({"x-pd-objective-ttft-ms": "5000"}, Objective(800, 30)),  # never looser
        ({"x-pd-objective-itl-ms": "12"}, Objective(800, 12)),
        ({"x-pd-objective-itl-ms": "1"}, Objective(800, 10)),
    ],
)
def test_a_client_tightens_its_objective_down_to_the_floor(
    headers: dict[str, str], expected: Objective
) -> None:
    floor = {"ttft_ms": 200, "itl_ms": 10}
    decision = classify(features(headers=headers), rules(allow_client_objective=floor), BOTH)
    assert decision.objective == expected


def test_a_client_may_not_tighten_without_the_rule_s_leave() -> None:
    request = features(headers={"x-pd-objective-ttft-ms": "100"})
    assert classify(request, rules(), BOTH).objective == Objective(800, 30)


def test_a_client_adds_no_bound_the_rule_does_not_set() -> None:
    only_ttft = parse_rules(
        [{"name": "c", "objective": {"ttft_ms": 800}, "allow_client_objective": {"itl_ms": 5}}]
    )
    request = features(headers={"x-pd-objective-itl-ms": "20"})
    assert classify(request, only_ttft, BOTH).objective == Objective(800, None)


@pytest.mark.parametrize("value", ["fast", "-5", "0", "1.5", "9" * 40, "3600001", "²", "١٢"])
def test_a_malformed_objective_header_is_named(value: str) -> None:
    request = features(headers={"x-pd-objective-ttft-ms": value})
    with pytest.raises(ClientObjectiveError) as caught:
        classify(request, rules(allow_client_objective={"ttft_ms": 100}), BOTH)
    assert caught.value.header == "x-pd-objective-ttft-ms"
    assert "x-pd-objective-ttft-ms" in str(caught.value)
    assert len(str(caught.value)) < 200


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        ({"name": "x"}, "give a path or an objective"),
        ({"name": "x", "path": "latency", "objective": {"ttft_ms": 1}}, "not both"),
        ({"name": "x", "path": "latency", "on_miss": "best"}, "on_miss needs an objective"),
        ({"name": "x", "objective": {}}, "give ttft_ms, itl_ms or both"),
        ({"name": "x", "objective": {"ttft_ms": 0}}, "greater than 0"),
        ({"name": "x", "objective": {"ttft_ms": 5}, "ways": []}, "at least one way"),
        ({"name": "x", "objective": {"ttft_ms": 5}, "ways": ["whole", "whole"]}, "each way once"),
        ({"name": "x", "objective": {"ttft_ms": 5}, "ways": ["fast"]}, "ways.0"),
        ({"name": "x", "objective": {"ttft_ms": 5}, "on_saturation": "spill"}, "on_miss"),
        (
            {
                "name": "x",
                "objective": {"ttft_ms": 300},
                "allow_client_objective": {"ttft_ms": 900},
            },
            "allow_client_objective.ttft_ms 900 is looser than the objective's 300",
        ),
    ],
)
def test_invalid_objective_rules_are_named(rule: dict[str, Any], problem: str) -> None:
    with pytest.raises(RulesError) as caught:
        parse_rules([rule])
    assert problem in str(caught.value)
    assert "rule 'x'" in str(caught.value)
