"""The JSON Schema of `router.yaml`, generated from the pydantic models that validate it.

`pd-gateway schema` prints it; `deploy/kustomize/router.schema.json` is a copy (a test keeps the two
equal), for editors (`# yaml-language-server: $schema=...`) and CI checks of a
configuration without the gateway installed.

The schema describes the file's shape: types, enums, bounds, required fields and unknown
keys. Cross-field checks (a pool's nodes unique, `renew_every_s` at most half of
`lease_ttl_s`, one way to give a secret) stay with `pd-gateway check`, which a file valid
against the schema can still fail.

Three parts are not read from the models as they are:

* `classification.rules` is typed `Any` in `ClassificationConfig` (the rules module
  validates it); its schema here is the rules format's (`policies.rules`), with the text
  and endpoint conditions spelled out (their validators are plain functions).
* `latency` may be written as one inline pool (`prefill`, `nodes`, `tilert`, `name`
  directly under it) or as `pools`: both forms are accepted.
* `base_dir` and `source` are filled in by the loader, never written in the file.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from policies.operators import OPERATORS
from policies.rules import DefaultSpec, RuleSpec
from policies.types import ENDPOINTS
from router.config import GatewayConfig
from router.parsers.registry import OUTPUT_PARSERS

_INTERNAL_FIELDS = ("base_dir", "source")
_TEXT_FIELDS = ("model", "api_key_name", "tenant", "user", "service_tier")
_TEXT_MAPS = ("headers", "metadata")

JsonObject = dict[str, Any]


def _text_condition() -> JsonObject:
    scalar: JsonObject = {"type": ["string", "number", "boolean"]}
    return {
        "title": "TextCondition",
        "description": "A value, a non-empty list of values, or a mapping of operators"
        " (ANDed): `present: true|false`, `prefix: <text>`, `regex: <pattern>` (searched,"
        " not anchored). Numbers and booleans compare as their text.",
        "anyOf": [
            scalar,
            {"type": "array", "items": scalar, "minItems": 1},
            {
                "type": "object",
                "properties": {
                    op: {"type": "boolean" if op == "present" else "string"} for op in OPERATORS
                },
                "additionalProperties": False,
                "minProperties": 1,
            },
        ],
    }


def _endpoint_condition() -> JsonObject:
    endpoint: JsonObject = {"enum": list(ENDPOINTS)}
    return {
        "title": "EndpointCondition",
        "description": "One endpoint (chat: /v1/chat/completions, completions:"
        " /v1/completions) or a non-empty list of them.",
        "anyOf": [endpoint, {"type": "array", "items": endpoint, "minItems": 1}],
    }


def _nullable(ref: str) -> JsonObject:
    return {"anyOf": [{"$ref": ref}, {"type": "null"}], "default": None}


def _rules_schema(defs: JsonObject) -> JsonObject:
    """The rules format's definitions, merged into `defs`; returns the schema of
    `classification.rules` (a mapping with `rules` and `default`, or a bare list)."""
    for model in (RuleSpec, DefaultSpec):
        generated = model.model_json_schema(ref_template="#/$defs/{model}")
        defs.update(generated.pop("$defs", {}))
        defs[model.__name__] = generated
    defs["TextCondition"] = _text_condition()
    defs["EndpointCondition"] = _endpoint_condition()
    match = defs["MatchSpec"]["properties"]
    for name in _TEXT_FIELDS:
        match[name] = _nullable("#/$defs/TextCondition")
    for name in _TEXT_MAPS:
        match[name] = {
            "anyOf": [
                {"type": "object", "additionalProperties": {"$ref": "#/$defs/TextCondition"}},
                {"type": "null"},
            ],
            "default": None,
        }
    match["endpoint"] = _nullable("#/$defs/EndpointCondition")
    rule_list: JsonObject = {"type": "array", "items": {"$ref": "#/$defs/RuleSpec"}}
    defs["RulesFile"] = {
        "title": "RulesFile",
        "description": "Ordered rules (first match wins) and the default action; or a bare"
        " list of rules.",
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "rules": {"anyOf": [rule_list, {"type": "null"}]},
                    "default": {"anyOf": [{"$ref": "#/$defs/DefaultSpec"}, {"type": "null"}]},
                },
                "additionalProperties": False,
            },
            rule_list,
            {"type": "null"},
        ],
    }
    return {"$ref": "#/$defs/RulesFile", "default": None}


def _latency_forms(defs: JsonObject) -> None:
    """`latency`: `pools`, or one pool written inline beside `max_seq_len`."""
    latency = defs["LatencyConfig"]
    pool = defs["LatencyPoolConfig"]
    pools_form = {
        "type": "object",
        "properties": latency["properties"],
        "required": latency.get("required", ["pools"]),
        "additionalProperties": False,
    }
    inline_form = {
        "type": "object",
        "properties": {**pool["properties"], "max_seq_len": latency["properties"]["max_seq_len"]},
        "required": pool.get("required", []),
        "additionalProperties": False,
    }
    defs["LatencyConfig"] = {
        "title": latency.get("title", "LatencyConfig"),
        "description": latency.get("description", ""),
        "anyOf": [pools_form, inline_form],
    }


def router_schema() -> JsonObject:
    """The JSON Schema (draft 2020-12) of router.yaml."""
    schema = copy.deepcopy(GatewayConfig.model_json_schema(ref_template="#/$defs/{model}"))
    defs: JsonObject = schema["$defs"]
    for name in _INTERNAL_FIELDS:
        schema["properties"].pop(name, None)
    defs["ClassificationConfig"]["properties"]["rules"] = _rules_schema(defs)
    defs["ModelConfig"]["properties"]["output_parser"] = {
        "enum": sorted(OUTPUT_PARSERS),
        "default": "none",
        "title": "Output Parser",
        "description": "How the model's raw output is split into reasoning, content and"
        " tool calls.",
    }
    _latency_forms(defs)
    schema["$defs"] = dict(sorted(defs.items()))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "pd-gateway router.yaml",
        **{k: v for k, v in schema.items() if k != "title"},
    }


def dumps(schema: JsonObject | None = None) -> str:
    """The schema as the shipped file holds it: indented, keys in a stable order."""
    return json.dumps(router_schema() if schema is None else schema, indent=2) + "\n"


__all__ = ["dumps", "router_schema"]
