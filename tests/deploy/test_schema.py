"""router.yaml's JSON Schema: `pd-gateway schema` prints the shipped copy, the schema is
typed all the way down (the rules included), and every shipped configuration validates
against it and names it for editors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from router.cli import main
from router.config import parse_config
from router.config.json_schema import dumps, router_schema
from tests.deploy.render import ROOT, shipped_configs

SHIPPED = ROOT / "deploy" / "kustomize" / "router.schema.json"


def validator() -> jsonschema.Draft202012Validator:
    schema = router_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_shipped_copy_is_the_generated_schema() -> None:
    assert SHIPPED.read_text(encoding="utf-8") == dumps(), (
        "deploy/kustomize/router.schema.json is stale: "
        "pd-gateway schema > deploy/kustomize/router.schema.json"
    )


def test_the_schema_command_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == router_schema()


def untyped(node: Any, where: str = "#") -> list[str]:
    """Places that accept anything: a schema with no type, $ref, enum, const or
    combinator (annotations such as title and default do not constrain)."""
    found: list[str] = []
    if isinstance(node, dict):
        constraining = {"type", "$ref", "enum", "const", "anyOf", "oneOf", "allOf", "not"}
        if not constraining & node.keys():
            found.append(where)
        for key in ("properties", "$defs"):
            for name, sub in node.get(key, {}).items():
                found += untyped(sub, f"{where}/{key}/{name}")
        for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            for i, sub in enumerate(node.get(key, [])):
                found += untyped(sub, f"{where}/{key}/{i}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                found += untyped(node[key], f"{where}/{key}")
    return found


def test_nothing_is_left_untyped() -> None:
    assert untyped(router_schema()) == []


def test_the_rules_are_typed() -> None:
    defs = router_schema()["$defs"]
    assert defs["ClassificationConfig"]["properties"]["rules"]["$ref"] == "#/$defs/RulesFile"
    match = defs["MatchSpec"]["properties"]
    assert match["headers"]["anyOf"][0]["additionalProperties"] == {"$ref": "#/$defs/TextCondition"}
    assert {"present", "prefix", "regex"} == set(defs["TextCondition"]["anyOf"][2]["properties"])
    check = validator()
    good = {
        "models": [
            {
                "name": "m",
                "tokenizer": "deepseek",
                "throughput": {"mode": "proxy", "urls": ["http://a:8000"]},
            }
        ],
        "classification": {
            "rules": {
                "rules": [
                    {
                        "name": "a",
                        "path": "latency",
                        "match": {
                            "headers": {"x-tier": {"prefix": "gold"}},
                            "endpoint": ["chat"],
                            "prompt_tokens": {"max": 9},
                        },
                    }
                ]
            }
        },
    }
    assert list(check.iter_errors(good)) == []
    parse_config(good)  # the gateway agrees
    bad_operator = json.loads(json.dumps(good))
    bad_operator["classification"]["rules"]["rules"][0]["match"]["user"] = {"glob": "*"}
    assert list(check.iter_errors(bad_operator))
    bad_path = json.loads(json.dumps(good))
    bad_path["classification"]["rules"]["rules"][0]["path"] = "fast"
    assert list(check.iter_errors(bad_path))


def test_both_forms_of_a_latency_section_validate() -> None:
    check = validator()
    inline = {"prefill": ["http://p:8000"], "nodes": [{"host": "n0"}], "tilert": "0.1.5"}
    pools = {"pools": [{"name": "a", **inline}], "max_seq_len": 4096}
    for latency in (inline, pools):
        config = {"models": [{"name": "m", "tokenizer": "deepseek", "latency": latency}]}
        assert list(check.iter_errors(config)) == []
        parse_config(config)
    wrong = {
        "models": [{"name": "m", "tokenizer": "deepseek", "latency": {**inline, "tilert": "0.2"}}]
    }
    assert list(check.iter_errors(wrong))


@pytest.mark.parametrize("path", shipped_configs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_configuration_validates_and_names_the_schema(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator().iter_errors(data)]
    assert errors == []
    parse_config(data)
    first = text.splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema=")
    target = (path.parent / first.partition("$schema=")[2].strip()).resolve()
    assert target == SHIPPED
