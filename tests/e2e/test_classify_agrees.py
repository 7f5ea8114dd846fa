"""`pd-gateway classify` decides as the running gateway does, on every endpoint: the same
bodies sent to a gateway and given to `classify` with its configuration get the same path
and rule (the gateway's `x-pd-route` and `x-pd-rule` headers, classify's output)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from router.cli import main
from sim.stack import SimStack
from tests.support.classify_fixtures import MODEL, REROUTE, ROUTE, RULE, proxy_throughput
from tests.support.deployment import latency_model
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.http import plain

RULES = {
    "default": {"name": "short", "path": "latency"},
    "rules": [
        {"name": "long-prompt", "match": {"prompt_tokens": {"min": 50}}, "path": "throughput"},
        {"name": "long-answer", "match": {"max_tokens": {"min": 500}}, "path": "throughput"},
    ],
}
LONG = " hello" * 80  # past 50 prompt tokens however it is rendered
HI = [{"role": "user", "content": "hi"}]
# (case, endpoint, body fields, the rule that must decide)
BODIES: list[tuple[str, str, dict[str, Any], str]] = [
    ("chat", "chat", {"messages": HI, "max_tokens": 8}, "short"),
    ("chat long prompt", "chat", {"messages": [{"role": "user", "content": LONG}]}, "long-prompt"),
    ("chat long answer", "chat", {"messages": HI, "max_tokens": 600}, "long-answer"),
    # The guard's own decision: the stack's TileRT 0.1.6 nodes report `ignore_eos`, as
    # classify assumes of their release.
    ("chat ignore_eos", "chat", {"messages": HI, "max_tokens": 8, "ignore_eos": True}, "short"),
    ("completion", "completions", {"prompt": "hi", "max_tokens": 8}, "short"),
    ("completion long prompt", "completions", {"prompt": LONG, "max_tokens": 8}, "long-prompt"),
    ("completion long answer", "completions", {"prompt": "hi", "max_tokens": 600}, "long-answer"),
    ("responses", "responses", {"input": "hi", "max_output_tokens": 16}, "short"),
    ("responses long prompt", "responses", {"input": LONG, "max_output_tokens": 9}, "long-prompt"),
    (
        "responses long answer",
        "responses",
        {"input": "hi", "max_output_tokens": 600},
        "long-answer",
    ),
    (
        "responses long instructions",
        "responses",
        {
            "instructions": LONG,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
            "max_output_tokens": 16,
        },
        "long-prompt",
    ),
]
PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
}


@pytest.fixture(scope="module")
def stack(sim_stacks: Any) -> SimStack:
    stack: SimStack = sim_stacks.get(nodes=1, prefills=1, proxy=True)
    return stack


@pytest.fixture(scope="module")
def gateway(stack: SimStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    models = [latency_model(stack, MODEL, throughput=proxy_throughput(stack))]
    with start_gateway(tmp_path_factory, models, classification={"rules": RULES}) as gateway:
        yield gateway


def classify(
    gateway: GatewayProcess,
    body: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> dict[str, str]:
    """The response headers `classify` prints, the endpoint detected from the body."""
    request = tmp_path / "body.json"
    request.write_text(json.dumps(body), encoding="utf-8")
    argv = ["classify", "--config", str(gateway.config_path), "--request", str(request)]
    assert main(argv) == 0
    headers = capsys.readouterr().out.split("response headers:\n", 1)[1]
    return dict(line.strip().split(": ", 1) for line in headers.splitlines())


@pytest.mark.parametrize(("case", "endpoint", "fields", "rule"), BODIES, ids=[b[0] for b in BODIES])
def test_classify_decides_as_the_gateway(
    gateway: GatewayProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
    endpoint: str,
    fields: dict[str, Any],
    rule: str,
) -> None:
    body = {"model": MODEL, **fields}
    answer = plain().post(gateway.url + PATHS[endpoint], json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    live = {name: answer.headers[name] for name in (ROUTE, RULE, REROUTE) if name in answer.headers}
    assert live[RULE] == rule
    assert live[ROUTE] == ("latency" if rule == "short" else "throughput")
    assert classify(gateway, body, tmp_path, capsys) == live
