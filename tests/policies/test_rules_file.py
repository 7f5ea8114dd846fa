"""The rules file model: parsing, defaults, loading, and errors that name rule and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from policies import Action, RulesError, load_rules, parse_rules

LATENCY = {"path": "latency"}


def rule(name: str = "r", **fields: Any) -> dict[str, Any]:
    return {"name": name, **LATENCY, **fields}


def test_full_rule_is_compiled_into_an_action_and_conditions() -> None:
    rules = parse_rules(
        {
            "default": {"name": "fallback", "path": "latency", "priority": 1},
            "rules": [
                rule(
                    "agents",
                    priority=10,
                    on_saturation="spill",
                    max_queue_wait_ms=250,
                    allow_client_route=["throughput"],
                    match={
                        "model": ["glm-5", "glm-5.1"],
                        "endpoint": "chat",
                        "headers": {"X-Workload": "agent"},
                        "prompt_tokens": {"max": 1000},
                    },
                )
            ],
        }
    )
    (agents,) = rules.rules
    assert agents.action == Action(
        name="agents",
        path="latency",
        priority=10,
        on_saturation="spill",
        max_queue_wait_ms=250,
        allow_client_route=frozenset({"throughput"}),
    )
    assert [c.label for c in agents.conditions] == ["model", "endpoint", "headers.x-workload"]
    assert agents.prompt_tokens is not None
    assert rules.default == Action(name="fallback", path="latency", priority=1)
    assert [r.name for r in rules.rules].count("fallback") == 0, "the default is not a rule"


@pytest.mark.parametrize("data", [None, {}, [], {"rules": []}, {"rules": None}])
def test_empty_rules_have_the_throughput_default(data: Any) -> None:
    rules = parse_rules(data)
    assert rules.rules == ()
    assert rules.default == Action(name="default", path="throughput")


def test_a_bare_list_is_the_rules() -> None:
    rules = parse_rules([rule("a"), rule("b", path="throughput")])
    assert [r.name for r in rules.rules] == ["a", "b"]
    assert [r.action.path for r in rules.rules] == ["latency", "throughput"]


def test_action_defaults() -> None:
    (only,) = parse_rules([rule("a")]).rules
    assert only.action == Action(name="a", path="latency")
    assert only.conditions == ()
    assert only.prompt_tokens is None


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        # the example from the rules-file documentation
        (
            [rule("agents", match={"prompt_tokens": {"min": 500, "max": 100}})],
            "rule 'agents': match.prompt_tokens: min 500 > max 100",
        ),
        (
            [rule("long", match={"max_tokens": {"min": 9, "max": 8}})],
            "rule 'long': match.max_tokens: min 9 > max 8",
        ),
        (
            [rule("neg", match={"prompt_tokens": {"min": -1}})],
            "rule 'neg': match.prompt_tokens.min: Input should be greater than or equal to 0",
        ),
        (
            [rule("neg", match={"max_tokens": {"max": -5}})],
            "rule 'neg': match.max_tokens.max: Input should be greater than or equal to 0",
        ),
        ([rule("open", match={"prompt_tokens": {}})], "rule 'open': match.prompt_tokens: give"),
        (
            [rule("typo", match={"prompt_tokens": {"minimum": 1}})],
            "rule 'typo': match.prompt_tokens.minimum: unknown field",
        ),
        ([rule("x", colour="red")], "rule 'x': colour: unknown field"),
        ([rule("x", match={"modle": "m"})], "rule 'x': match.modle: unknown field"),
        (
            [rule("x", match={"headers": {"x-w": {"sufix": "a"}}})],
            "rule 'x': match.headers.x-w: unknown operator 'sufix'",
        ),
        (
            [rule("x", match={"metadata": {"tier": {"equals": "a"}}})],
            "rule 'x': match.metadata.tier: unknown operator 'equals'",
        ),
        ([rule("x", match={"user": {}})], "rule 'x': match.user: no operator given"),
        (
            [rule("x", match={"api_key_name": {"present": False, "prefix": "a"}})],
            "rule 'x': match.api_key_name: present: false cannot be combined",
        ),
        (
            [rule("x", match={"headers": {"x-w": {"present": "yes"}}})],
            "rule 'x': match.headers.x-w: present: expected true or false",
        ),
        (
            [rule("x", match={"headers": {"x-w": {"present": None}}})],
            "rule 'x': match.headers.x-w: present: expected true or false",
        ),
        (
            [rule("x", match={"headers": {"x-w": {"prefix": 3}}})],
            "rule 'x': match.headers.x-w: prefix: expected a string",
        ),
        (
            [rule("rx", match={"headers": {"x-w": {"regex": "agent("}}})],
            "rule 'rx': match.headers.x-w: regex: bad pattern 'agent('",
        ),
        ([rule("x", match={"model": []})], "rule 'x': match.model: an empty list matches nothing"),
        ([rule("x", match={"model": [["a"]]})], "rule 'x': match.model: a list of values"),
        ([rule("x", match={"headers": {"x-w": None}})], "rule 'x': match.headers.x-w: expected"),
        (
            [rule("x", match={"headers": {"bad header": "v"}})],
            "rule 'x': match.headers: 'bad header' is not a valid header name",
        ),
        (
            [rule("x", match={"headers": {"X-W": "a", "x-w": "b"}})],
            "rule 'x': match.headers: 'x-w' given twice",
        ),
        ([rule("x", match={"endpoint": "embeddings"})], "rule 'x': match.endpoint: expected"),
        ([rule("x", match={"endpoint": []})], "rule 'x': match.endpoint: expected"),
        ([rule("x", match={"stream": "yes"})], "rule 'x': match.stream: Input should be"),
        ([rule("x", match={"tools": 1})], "rule 'x': match.tools: Input should be"),
        ([rule("x", path="fast")], "rule 'x': path: Input should be 'latency' or 'throughput'"),
        ([rule("x", on_saturation="wait")], "rule 'x': on_saturation: Input should be"),
        ([rule("x", priority="5")], "rule 'x': priority: Input should be a valid integer"),
        ([rule("x", max_queue_wait_ms=-1)], "rule 'x': max_queue_wait_ms: Input should be"),
        ([rule("x", allow_client_route=["any"])], "rule 'x': allow_client_route.0: Input"),
        ([{"path": "latency"}], "rule #1: name: required"),
        ([{"name": "x"}], "rule 'x': give a path or an objective"),
        ([rule("ok"), {"name": "bad name", **LATENCY}], "rule #2: name: String should match"),
        (["latency"], "rule #1: expected a mapping"),
        (
            [rule("a"), rule("b"), rule("a")],
            "rule 'a': name: 'a' is already used by rule #1",
        ),
        (
            {"rules": [rule("default")], "default": {}},
            "default: name: 'default' is already used by rule #1",
        ),
        ({"default": {"path": "slow"}}, "default: path: Input should be"),
        ({"default": {"match": {}}}, "default: match: unknown field"),
        ({"rules": {"a": rule("a")}}, "rules: expected a list"),
        ({"rules": [], "version": 2}, "unknown field 'version'"),
        ("latency", "expected a mapping with 'rules' and 'default'"),
    ],
)
def test_validation_errors_name_rule_and_field(data: Any, problem: str) -> None:
    with pytest.raises(RulesError) as error:
        parse_rules(data)
    assert any(p.startswith(problem) for p in error.value.problems), error.value.problems


def test_every_problem_is_reported() -> None:
    data = [
        rule("a", match={"prompt_tokens": {"min": 5, "max": 1}}, priority="high"),
        rule("b", match={"stream": "maybe"}),
        rule("a"),
    ]
    with pytest.raises(RulesError) as error:
        parse_rules(data)
    problems = error.value.problems
    assert len(problems) == 3
    assert "match.prompt_tokens: min 5 > max 1" in problems[0]
    assert "priority: Input should be a valid integer" in problems[0]
    assert problems[1].startswith("rule 'b': match.stream")
    assert problems[2] == "rule 'a': name: 'a' is already used by rule #1"
    assert str(error.value) == "\n".join(problems)


def test_load_rules_reads_yaml(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n  - name: voice\n    match: {headers: {x-workload: voice}}\n    path: latency\n"
    )
    rules = load_rules(path)
    assert [r.name for r in rules.rules] == ["voice"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("rules: [", "not valid YAML"),
        ("rules:\n  - {name: a, path: nowhere}\n", "rule 'a': path: Input should be"),
    ],
)
def test_load_rules_errors_name_the_file(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    with pytest.raises(RulesError) as error:
        load_rules(path)
    assert error.value.source == str(path)
    assert str(error.value).startswith(f"{path}: {problem}")


def test_load_rules_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RulesError, match="cannot read"):
        load_rules(tmp_path / "absent.yaml")
