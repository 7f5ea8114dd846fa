"""Classification through running gateways: the example rules, the capability guard, client
route requests and the explanation headers, on both paths and on errors.

One gateway per example rules file in policies/examples/, all over one stack. Each request's
headers are checked against what actually served it: a decode on the TileRT node for the
latency path, a request seen by the native proxy for the throughput path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest

from sim.stack import SimStack
from tests.support.classify_fixtures import (
    EXAMPLES,
    MODEL,
    REROUTE,
    ROUTE,
    RULE,
    Sims,
    closed_node,
    observed,
    openai_client,
    proxy_throughput,
    say,
)
from tests.support.deployment import gateway_config, latency_model, request_decodes
from tests.support.gateway import GatewayProcess, running_gateways
from tests.support.stacks import StackPool

LATENCY_ONLY = "sim-latency-only"  # no throughput path; its node is never reached
TEXT = "classified: 好的 ✓"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


def padded(tokens: int) -> str:
    """Prompt text of `tokens` tokens (" hello" is one token), put before the directive."""
    return " hello" * tokens


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    # The native path's context is longer than the TileRT pool's, as a deployment's may be:
    # requests the guard moves for their length are then answered there.
    return sim_stacks.get(
        nodes=1,
        prefills=1,
        proxy=True,
        # A node reporting no feature: every decoding option the guard knows goes native.
        node_args=["--step-ms", "5", "--capabilities", '{"ignore_eos": false}'],
        prefill_args=["--itl-ms", "0"],
        proxy_args=["--itl-ms", "1", "--prefill-ms-per-token", "0", "--max-model-len", "262144"],
    )


@pytest.fixture(scope="module")
def gateways(
    stack: SimStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, GatewayProcess]]:
    models = [
        latency_model(stack, MODEL, throughput=proxy_throughput(stack)),
        {
            "name": LATENCY_ONLY,
            "tokenizer": "deepseek",
            "latency": {"prefill": [stack.prefills[0].url], "nodes": [closed_node()]},
        },
    ]
    configs = {
        name: gateway_config(models, classification={"rules_file": str(EXAMPLES / f"{name}.yaml")})
        for name in ("interactive", "api-key-tiers", "latency-first")
    }
    with running_gateways(tmp_path_factory, configs) as running:
        yield running


@pytest.fixture
async def sims(stack: SimStack, gateways: dict[str, GatewayProcess]) -> AsyncIterator[Sims]:
    """As the shared `sims`, watching all three gateways."""
    async with observed(stack, *gateways.values()) as watching:
        yield watching


@dataclass(frozen=True, slots=True)
class Call:
    """One chat call: SDK arguments on top of `say(TEXT)`, and extra headers."""

    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    vllm: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: Any
    text: str | None


async def send(gateway: GatewayProcess, sims: Sims, call: Call, model: str = MODEL) -> Answer:
    """Make `call` with the OpenAI SDK; the status, headers and text the client received."""
    client = openai_client(gateway, sims.http)
    body = {**say(TEXT), "model": model, **call.body}
    if call.prompt_tokens:
        content = padded(call.prompt_tokens) + body["messages"][0]["content"]
        body["messages"] = [{"role": "user", "content": content}]
    try:
        raw = await client.chat.completions.with_raw_response.create(
            **body, extra_headers=call.headers or None, extra_body=call.vllm or None
        )
    except openai.APIStatusError as exc:
        return Answer(exc.status_code, exc.response.headers, None)
    if body.get("stream"):
        parts = [c.choices[0].delta.content or "" async for c in raw.parse() if c.choices]
        return Answer(raw.status_code, raw.headers, "".join(parts))
    return Answer(raw.status_code, raw.headers, raw.parse().choices[0].message.content)


async def served_by(sims: Sims) -> list[str]:
    """Which paths answered since the last reset: a node decode, a native proxy request."""
    stack = sims.stack
    assert stack.proxy is not None
    decodes = (await sims.records(stack.nodes[0]))["decodes"]
    paths = ["latency"] * len(request_decodes(decodes))
    return paths + ["throughput"] * len(await sims.requests(stack.proxy.url))


def decision(answer: Answer) -> tuple[str | None, str | None, str | None]:
    headers = answer.headers
    return headers.get(ROUTE), headers.get(RULE), headers.get(REROUTE)


# (rules file, call, rule that must match, path). At least one call per rule and default.
EXAMPLE_CALLS = [
    ("interactive", Call(headers={"x-workload": "batch"}), "batch", "throughput"),
    ("interactive", Call(body={"metadata": {"workload": "eval"}}), "evals", "throughput"),
    ("interactive", Call(prompt_tokens=70_000), "long-prompts", "throughput"),
    ("interactive", Call({"x-workload": "voice"}, {"stream": True}), "voice", "latency"),
    ("interactive", Call(headers={"x-workload": "agent-planner"}), "agents", "latency"),
    (
        "interactive",
        Call(
            headers={"user-agent": "code-assist/1.4"},
            body={"stream": True, "tools": TOOLS, "max_tokens": 2048},
        ),
        "coding",
        "latency",
    ),
    ("interactive", Call(headers={"x-workload": "chat"}), "default", "throughput"),
    (
        "api-key-tiers",
        Call({"x-pd-api-key-name": "nightly-regression"}),
        "internal-evals",
        "throughput",
    ),
    ("api-key-tiers", Call({"x-pd-api-key-name": "premium-acme"}), "premium", "latency"),
    ("api-key-tiers", Call({"x-pd-api-key-name": "pro-acme"}), "pro", "latency"),
    # A pro key over its max_tokens range falls through to the default.
    (
        "api-key-tiers",
        Call({"x-pd-api-key-name": "pro-acme"}, {"max_tokens": 5000}),
        "standard",
        "throughput",
    ),
    ("api-key-tiers", Call(), "anonymous", "throughput"),
    ("api-key-tiers", Call({"x-pd-api-key-name": "team-blue"}), "standard", "throughput"),
    ("latency-first", Call(headers={"x-priority": "batch"}), "batch", "throughput"),
    ("latency-first", Call(body={"max_tokens": 9000}), "long-generations", "throughput"),
    ("latency-first", Call(prompt_tokens=140_000), "over-context", "throughput"),
    ("latency-first", Call(), "interactive", "latency"),
]


@pytest.mark.parametrize(
    ("example", "call", "rule", "path"),
    [pytest.param(*case, id=f"{case[0]}:{case[2]}") for case in EXAMPLE_CALLS],
)
async def test_every_example_rule_routes_through_the_gateway(
    gateways: dict[str, GatewayProcess], sims: Sims, example: str, call: Call, rule: str, path: str
) -> None:
    answer = await send(gateways[example], sims, call)
    assert answer.status == 200
    assert answer.text == TEXT
    assert decision(answer) == (path, rule, None)
    assert await served_by(sims) == [path]


# On latency-first (default: latency, client may ask for throughput; the TileRT pool's
# max_seq_len is 131072): what the latency path cannot honour goes to throughput.
GUARD_CALLS = [
    pytest.param(Call(body={"n": 2}), "n", id="n"),
    pytest.param(Call(body={"logprobs": True, "top_logprobs": 2}), "logprobs", id="logprobs"),
    pytest.param(
        Call(body={"tools": TOOLS, "tool_choice": "required"}), "tool_choice", id="tool_choice"
    ),
    pytest.param(Call(vllm={"ignore_eos": True}), "ignore_eos", id="ignore_eos"),
    pytest.param(
        Call(body={"response_format": {"type": "json_object"}}),
        "response_format",
        id="response_format",
    ),
    # Streamed, so the long-generations rule does not match; the budget alone overflows.
    pytest.param(
        Call(body={"stream": True, "max_tokens": 131_072}), "context_length", id="budget-overflow"
    ),
    # Only the count can tell: 4,000 prompt tokens plus 128,000 overflow 131,072.
    pytest.param(
        Call(body={"stream": True, "max_tokens": 128_000}, prompt_tokens=4000),
        "context_length",
        id="counted-overflow",
    ),
    pytest.param(
        Call(body={"stream": True, "max_tokens": 129_000}, prompt_tokens=500),
        None,
        id="counted-fits",
    ),
]


@pytest.mark.parametrize(("call", "reason"), GUARD_CALLS)
async def test_the_capability_guard_reroutes_with_its_reason(
    gateways: dict[str, GatewayProcess], sims: Sims, call: Call, reason: str | None
) -> None:
    answer = await send(gateways["latency-first"], sims, call)
    assert answer.status == 200
    path = "latency" if reason is None else "throughput"
    assert decision(answer) == (path, "interactive", reason)
    assert await served_by(sims) == [path]


# (call with an x-pd-route header, rule, path): honoured only where the rule allows it.
CLIENT_ROUTES = [
    pytest.param(Call({"x-pd-route": "throughput"}), "interactive", "throughput", id="allowed"),
    pytest.param(
        Call({"x-pd-route": "latency", "x-priority": "batch"}), "batch", "latency", id="allowed-in"
    ),
    pytest.param(
        Call({"x-pd-route": "latency"}, {"max_tokens": 9000}),
        "long-generations",
        "throughput",
        id="not-allowed",
    ),
    pytest.param(Call({"x-pd-route": "sideways"}), "interactive", "latency", id="unknown-value"),
]


@pytest.mark.parametrize(("call", "rule", "path"), CLIENT_ROUTES)
async def test_a_client_route_is_honoured_only_where_the_rule_allows(
    gateways: dict[str, GatewayProcess], sims: Sims, call: Call, rule: str, path: str
) -> None:
    answer = await send(gateways["latency-first"], sims, call)
    assert answer.status == 200
    assert decision(answer) == (path, rule, None)
    assert await served_by(sims) == [path]


async def test_the_guard_overrides_a_client_route(
    gateways: dict[str, GatewayProcess], sims: Sims
) -> None:
    call = Call({"x-pd-route": "latency", "x-priority": "batch"}, {"n": 2})
    answer = await send(gateways["latency-first"], sims, call)
    assert decision(answer) == ("throughput", "batch", "n")
    assert await served_by(sims) == ["throughput"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_errors_carry_the_decision_on_both_paths(
    gateways: dict[str, GatewayProcess], sims: Sims, stream: bool
) -> None:
    gateway = gateways["latency-first"]
    stack = sims.stack
    assert stack.proxy is not None
    body = {"stream": stream}
    await sims.arm(stack.proxy.url, {"http_status": 503, "count": 1})
    native = await send(gateway, sims, Call({"x-pd-route": "throughput"}, body))
    assert (native.status, decision(native)) == (503, ("throughput", "interactive", None))
    # The batch rule queues (no spill), so a failed prefill reaches the client.
    await sims.arm(stack.prefills[0].url, {"http_status": 503, "count": 1})
    latency = await send(
        gateway, sims, Call({"x-pd-route": "latency", "x-priority": "batch"}, body)
    )
    assert (latency.status, decision(latency)) == (503, ("latency", "batch", None))
    # A request only the throughput path can serve, for a model without one.
    nowhere = await send(gateway, sims, Call(body={**body, "n": 2}), model=LATENCY_ONLY)
    assert (nowhere.status, decision(nowhere)) == (400, ("throughput", "interactive", "n"))
