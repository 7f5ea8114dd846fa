"""Both paths give one message shape: the same scripted outputs through the latency path
(the gateway parses the TileRT node's ids) and the throughput path (the simulated vLLM runs
the reasoning and tool-call parsers the demo gives it for the model's `output_parser`), on
one gateway, streamed and not.

A header picks the path: `x-path: native` goes to vLLM's native disaggregation (pull mode,
the decode server answers), anything else to the latency path.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from demo.plan import parser_flags
from sim.stack import SimStack
from tests.support.deployment import directive, latency_model
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.parser_fixtures import (
    CASES,
    DEEPSEEK,
    GLM5,
    GLM45,
    GLM_TOKENIZER,
    SERVED,
    TOOLS,
    Case,
)
from tests.support.stacks import StackPool

pytestmark = pytest.mark.usefixtures("all_slots_free")

FAST = {
    "node_args": ["--step-ms", "1"],
    "prefill_args": ["--itl-ms", "0", "--prefill-ms-per-token", "0"],
    "decode_args": ["--itl-ms", "0", "--prefill-ms-per-token", "0"],
}
CLASSIFICATION = {
    "rules": {
        "default": {"name": "fast", "path": "latency"},
        "rules": [
            {"name": "native", "match": {"headers": {"x-path": "native"}}, "path": "throughput"}
        ],
    }
}
PATHS = {"latency": {}, "throughput": {"x-path": "native"}}

# (reasoning, content, [(name, arguments as JSON values)], finish_reason)
View = tuple[str | None, str | None, list[tuple[str, Any]], str]


@pytest.fixture(scope="module")
def deepseek_stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=1,
        prefills=1,
        decodes=1,
        tokenizer="deepseek",
        model=DEEPSEEK,
        instance_args={"decode-0": parser_flags("deepseek_v32")},
        **FAST,
    )


@pytest.fixture(scope="module")
def glm_stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=2,
        prefills=1,
        decodes=2,
        tokenizer="glm",
        model=[GLM5, GLM45],
        instance_args={"decode-0": parser_flags("glm47"), "decode-1": parser_flags("glm45")},
        **FAST,
    )


def pull(stack: SimStack, decode: int) -> dict[str, Any]:
    return {
        "mode": "pull",
        "prefill": [stack.prefills[0].url],
        "decode": [stack.decodes[decode].url],
    }


@pytest.fixture(scope="module")
def gateway(
    deepseek_stack: SimStack, glm_stack: SimStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    glm = str(GLM_TOKENIZER)
    models = [
        latency_model(
            deepseek_stack,
            DEEPSEEK,
            output_parser="deepseek_v32",
            throughput=pull(deepseek_stack, 0),
        ),
        latency_model(
            glm_stack,
            GLM5,
            nodes=[glm_stack.nodes[0]],
            tokenizer=glm,
            output_parser="glm47",
            throughput=pull(glm_stack, 0),
        ),
        latency_model(
            glm_stack,
            GLM45,
            nodes=[glm_stack.nodes[1]],
            tokenizer=glm,
            output_parser="glm45",
            throughput=pull(glm_stack, 1),
        ),
    ]
    with start_gateway(tmp_path_factory, models, classification=CLASSIFICATION) as running:
        yield running


def body(case: Case, *, stream: bool) -> dict[str, Any]:
    request: dict[str, Any] = {
        "model": SERVED[case.parser],
        "messages": [{"role": "user", "content": directive(case.output)}],
        "tools": TOOLS,
        "max_tokens": 512,
        "stream": stream,
    }
    if case.template is not None:
        request["chat_template_kwargs"] = case.template
    return request


def _calls(calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    assert all(c["id"].startswith("chatcmpl-tool-") and c["type"] == "function" for c in calls)
    assert len({c["id"] for c in calls}) == len(calls)
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def ask(http: httpx.Client, gateway: GatewayProcess, case: Case, path: str) -> View:
    url = gateway.base_url + "/chat/completions"
    response = http.post(url, json=body(case, stream=False), headers=PATHS[path])
    assert response.status_code == 200, response.text
    assert response.headers["x-pd-route"] == path
    choice = response.json()["choices"][0]
    message = choice["message"]
    reasoning = message.get("reasoning")
    calls = _calls(message.get("tool_calls") or [])
    return reasoning, message["content"], calls, choice["finish_reason"]


def ask_streamed(http: httpx.Client, gateway: GatewayProcess, case: Case, path: str) -> View:
    url = gateway.base_url + "/chat/completions"
    reasoning, content, finish = "", "", None
    calls: dict[int, dict[str, Any]] = {}
    with http.stream("POST", url, json=body(case, stream=True), headers=PATHS[path]) as response:
        assert response.status_code == 200
        assert response.headers["x-pd-route"] == path
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[len("data: ") :])["choices"]:
                delta = choice["delta"]
                reasoning += delta.get("reasoning") or ""
                content += delta.get("content") or ""
                for part in delta.get("tool_calls") or []:
                    call = calls.setdefault(
                        part["index"], {"function": {"name": "", "arguments": ""}}
                    )
                    call.update({k: part[k] for k in ("id", "type") if part.get(k)})
                    function = part.get("function") or {}
                    call["function"]["name"] += function.get("name") or ""
                    call["function"]["arguments"] += function.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
    assert finish is not None
    ordered = [calls[i] for i in sorted(calls)]
    return reasoning or None, content or None, _calls(ordered), finish


def expected(case: Case) -> View:
    calls = [(c.name, c.arguments) for c in case.calls]
    return case.reasoning, case.content, calls, case.finish_reason


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as client:
        yield client


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_both_paths_parse_alike(http: httpx.Client, gateway: GatewayProcess, case: Case) -> None:
    latency = ask(http, gateway, case, "latency")
    native = ask(http, gateway, case, "throughput")
    assert native == latency == expected(case)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_both_paths_stream_alike(http: httpx.Client, gateway: GatewayProcess, case: Case) -> None:
    latency = ask_streamed(http, gateway, case, "latency")
    native = ask_streamed(http, gateway, case, "throughput")
    assert native == latency == expected(case)
