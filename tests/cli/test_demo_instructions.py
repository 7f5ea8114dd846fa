"""What the demo prints: example requests checked against the rules, runnable curl and SDK."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from demo.instructions import Example, curl, find_example, instructions, sdk_snippet
from router.config import load_config, parse_config

PROJECT_ROOT = Path(__file__).resolve().parents[2]
BASE = "http://127.0.0.1:8000/v1"
LATENCY = {"prefill": ["http://127.0.0.1:8100"], "nodes": [{"host": "127.0.0.1"}]}
PROXY = {"mode": "proxy", "urls": ["http://127.0.0.1:8300"]}


def config_of(rules: Any, **sections: Any) -> Any:
    document = {
        "models": [{"name": "m", "tokenizer": "deepseek", **sections}],
        "classification": {"rules": rules},
    }
    return parse_config(document, base_dir=PROJECT_ROOT)


def test_default_configuration_examples() -> None:
    config = load_config(PROJECT_ROOT / "router.yaml")
    latency = find_example(config, "latency", stream=True)
    throughput = find_example(config, "throughput", stream=False)
    assert latency is not None and throughput is not None
    assert (latency.body["model"], latency.headers, latency.rule) == (
        "deepseek-v3.2",
        {},
        "interactive",
    )
    assert (throughput.headers, throughput.rule) == ({"x-workload": "batch"}, "batch")


@pytest.mark.parametrize(
    ("rules", "sections", "path", "headers", "rule"),
    [
        # Throughput by default: the client route header is the way to latency.
        (
            {"default": {"path": "throughput", "allow_client_route": ["latency"]}},
            {"latency": LATENCY, "throughput": PROXY},
            "latency",
            {"x-pd-route": "latency"},
            "default",
        ),
        # Only rules that count tokens reach latency: no plain example exists.
        (
            {
                "rules": [
                    {"name": "short", "match": {"prompt_tokens": {"max": 2}}, "path": "latency"}
                ],
                "default": {"path": "throughput"},
            },
            {"latency": LATENCY, "throughput": PROXY},
            "latency",
            None,
            None,
        ),
        # A model without a throughput path never yields a throughput example.
        ({"default": {"path": "throughput"}}, {"latency": LATENCY}, "throughput", None, None),
    ],
    ids=["client-route", "token-rules", "no-throughput"],
)
def test_examples_follow_the_rules(
    rules: Any,
    sections: dict[str, Any],
    path: str,
    headers: dict[str, str] | None,
    rule: str | None,
) -> None:
    example = find_example(config_of(rules, **sections), path, stream=True)
    if headers is None:
        assert example is None
    else:
        assert example is not None and (example.headers, example.rule) == (headers, rule)


def test_the_instructions_say_when_a_path_has_no_example() -> None:
    text = instructions(config_of({"default": {"path": "latency"}}, latency=LATENCY), BASE)
    assert "No plain chat request takes the throughput path under these rules." in text
    assert "# throughput path" not in text
    assert "# latency path (rule 'default'), streamed" in text


def test_curl_is_one_valid_command() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "it's"}], "stream": True}
    example = Example("throughput", body, {"x-workload": "batch"}, "batch")
    argv = shlex.split(curl(BASE, example).replace("\\\n", ""))
    assert argv[:3] == ["curl", "-siN", BASE + "/chat/completions"]
    assert argv[3:7] == ["-H", "content-type: application/json", "-H", "x-workload: batch"]
    assert argv[7] == "-d" and json.loads(argv[8]) == body


def test_sdk_snippet_is_python_with_both_calls() -> None:
    config = load_config(PROJECT_ROOT / "router.yaml")
    snippet = sdk_snippet(
        BASE,
        find_example(config, "latency", stream=True),
        find_example(config, "throughput", stream=False),
    )
    compile(snippet, "<snippet>", "exec")
    assert f"OpenAI(base_url={BASE!r}, api_key='unused')" in snippet
    assert "    stream=True," in snippet
    assert "    extra_headers={'x-workload': 'batch'}," in snippet
