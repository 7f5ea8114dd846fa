"""What differs between TileRT 0.1.5 and 0.1.6 nodes, end to end through the OpenAI SDK:
logprobs and JSON formats on the latency path where the nodes support them, the guard
following the nodes' live capabilities, typed refusals, and orphaned transfers flushed.

Every test runs against a pool of each release (`tilert_version`); the shared fixtures
check that no node's receive buffer was ever overwritten.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from sim.stack import SimStack
from tests.support.classify_fixtures import proxy_throughput
from tests.support.deployment import (
    directive,
    latency_model,
    request_decodes,
    sim_get,
    sim_post,
    version_args,
)
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.http import plain
from tests.support.legs import tilert_prefill_body
from tests.support.stacks import StackPool

pytestmark = pytest.mark.usefixtures("fresh_sims", "all_slots_free")

MODEL = "m"
TEXT = "The quick brown fox jumps over the lazy dog"
JSON_TEXT = '{"city": "Paris", "days": 3}'
SPILL = {"default": {"name": "interactive", "path": "latency", "on_saturation": "spill"}}
FEATURES = {"logprobs": True, "grammar": True, "ignore_eos": True, "penalties": False}


@pytest.fixture(scope="module")
def stack(tilert_version: str, sim_stacks: StackPool) -> SimStack:
    """Nodes 0 and 1 serve the module's gateway; node 2 is left for the orphan tests."""
    version = version_args(tilert_version)
    node_args = ["--step-ms", "2", *version["node_args"]]
    if tilert_version == "0.1.6":
        node_args += ["--capabilities", json.dumps(FEATURES)]
    return sim_stacks.get(
        nodes=3,
        prefills=1,
        proxy=True,
        model=MODEL,
        node_args=node_args,
        prefill_args=["--itl-ms", "0", *version["prefill_args"]],
        proxy_args=["--itl-ms", "0"],
    )


def model_entry(stack: SimStack, version: str, nodes: list[Any]) -> dict[str, Any]:
    entry = latency_model(
        stack, MODEL, nodes=nodes, tilert=version, throughput=proxy_throughput(stack)
    )
    entry["latency"]["continuations"] = 2  # a node may die on each of the two nodes
    return entry


@pytest.fixture(scope="module")
def gateway(
    stack: SimStack, tilert_version: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    with start_gateway(
        tmp_path_factory,
        [model_entry(stack, tilert_version, stack.nodes[:2])],
        gate={"capabilities_interval_s": 0.1},
    ) as running:
        yield running


@pytest.fixture
def features(stack: SimStack, tilert_version: str) -> Iterator[Callable[..., None]]:
    """`features(**flags)`: change what the 0.1.6 nodes report; restored after the test."""

    def change(**flags: bool) -> None:
        for node in stack.nodes:
            sim_post(node.url, "/sim/capabilities", flags)

    yield change
    if tilert_version == "0.1.6":
        change(**FEATURES)


def route(raw: Any) -> tuple[str, str | None]:
    return raw.headers["x-pd-route"], raw.headers.get("x-pd-reroute-reason")


def messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": directive(text)}]


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)  # polling another process's state, bounded above


def reported(gateway: GatewayProcess, feature: str) -> list[bool]:
    """Whether each node of the pool last reported `feature` (the guard needs all)."""
    facts = gateway.pool()["models"][MODEL]["node_facts"]
    return [feature in node["features"] for node in facts.values()]


# Logprobs -----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs(client: openai.OpenAI, tilert_version: str, stream: bool) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages(TEXT), logprobs=True, top_logprobs=2, stream=stream
    )
    if tilert_version == "0.1.5":  # no logprobs on 0.1.5 nodes: vLLM's native path
        assert route(raw) == ("throughput", "logprobs")
        return
    assert route(raw) == ("latency", None)
    if stream:
        chunks = [c for c in raw.parse() if c.choices]
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        entries = [
            e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content
        ]
    else:
        choice = raw.parse().choices[0]
        text = choice.message.content
        assert choice.logprobs is not None and choice.logprobs.content is not None
        entries = choice.logprobs.content
    assert text == TEXT
    assert "".join(e.token for e in entries) == TEXT
    for entry in entries:
        assert entry.logprob <= 0 and entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs(client: openai.OpenAI, tilert_version: str, stream: bool) -> None:
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt=directive(TEXT), logprobs=1, max_tokens=64, stream=stream
    )
    if tilert_version == "0.1.5":
        assert route(raw) == ("throughput", "logprobs")
        return
    assert route(raw) == ("latency", None)
    choices = [c.choices[0] for c in raw.parse() if c.choices] if stream else raw.parse().choices
    text = "".join(c.text for c in choices)
    tokens = [t for c in choices if c.logprobs for t in c.logprobs.tokens or []]
    offsets = [o for c in choices if c.logprobs for o in c.logprobs.text_offset or []]
    tops = [d for c in choices if c.logprobs for d in c.logprobs.top_logprobs or []]
    assert text == TEXT and "".join(tokens) == TEXT
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    assert all(len(top) == 1 for top in tops)


# ignore_eos (guidellm sends it by default) ----------------------------------------------


def test_ignore_eos_stays_on_the_latency_path_where_the_nodes_honour_it(
    client: openai.OpenAI, tilert_version: str
) -> None:
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt=directive(TEXT), max_tokens=24, extra_body={"ignore_eos": True}
    )
    if tilert_version == "0.1.5":  # 0.1.5 nodes do not report the feature
        assert route(raw) == ("throughput", "ignore_eos")
        return
    assert route(raw) == ("latency", None)
    # The node generated past the scripted text and its EOS, to the whole budget.
    choice = raw.parse().choices[0]
    assert choice.text.startswith(TEXT) and len(choice.text) > len(TEXT)
    assert (choice.finish_reason, raw.parse().usage.completion_tokens) == ("length", 24)


# Structured output ----------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_json_schema_format_is_the_nodes_grammar(
    client: openai.OpenAI, stack: SimStack, tilert_version: str, stream: bool
) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages(JSON_TEXT),
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
        stream=stream,
    )
    if tilert_version == "0.1.5":  # no grammars on 0.1.5
        assert route(raw) == ("throughput", "response_format")
        return
    assert route(raw) == ("latency", None)
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    else:
        text = raw.parse().choices[0].message.content
    assert json.loads(text) == {"city": "Paris", "days": 3}
    decodes = [d for n in stack.nodes[:2] for d in sim_get(n.url, "/sim/records")["decodes"]]
    assert [d["request"]["grammar_spec"] for d in decodes] == [
        {"type": "json_schema", "value": schema}
    ]


def test_a_grammar_is_not_continued_on_an_output_under_way(
    gateway: GatewayProcess, stack: SimStack, tilert_version: str
) -> None:
    """The next node's grammar (and its prefill's) would start afresh on an output already
    under way: a JSON answer whose node dies ends with an error event, not broken JSON."""
    for node in stack.nodes[:2]:
        sim_post(node.url, "/sim/faults", {"die_after": 3, "count": 1})
    body = {
        "model": MODEL,
        "messages": messages(JSON_TEXT),
        "response_format": {"type": "json_object"},
        "stream": True,
    }
    with httpx.Client(timeout=30) as http:
        answer = http.post(gateway.base_url + "/chat/completions", json=body)
    if tilert_version == "0.1.5":  # no grammars on 0.1.5: the native path's, whole
        assert answer.headers["x-pd-route"] == "throughput"
        return
    events = [e for e in answer.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and '"error"' in events[-2]
    records = [sim_get(node.url, "/sim/records")["decodes"] for node in stack.nodes[:2]]
    assert len([d for r in records for d in request_decodes(r)]) == 1


# The guard follows the nodes ------------------------------------------------------------


def test_the_guard_follows_the_nodes_reported_capabilities(
    client: openai.OpenAI,
    gateway: GatewayProcess,
    tilert_version: str,
    features: Callable[..., None],
) -> None:
    def ask() -> tuple[str, str | None]:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages(TEXT), logprobs=True
        )
        return route(raw)

    if tilert_version == "0.1.5":
        assert gateway.pool()["models"][MODEL]["node_facts"]
        assert all(
            f["tilert"] == "0.1.5" and f["features"] == []
            for f in gateway.pool()["models"][MODEL]["node_facts"].values()
        )
        assert ask() == ("throughput", "logprobs")
        return
    features(logprobs=False)
    wait_for(lambda: not any(reported(gateway, "logprobs")), "the prober's refresh")
    assert ask() == ("throughput", "logprobs")
    features(logprobs=True)
    wait_for(lambda: all(reported(gateway, "logprobs")), "the prober's refresh")
    assert ask() == ("latency", None)


def test_a_feature_the_node_refuses_spills_and_is_believed(
    stack: SimStack,
    tilert_version: str,
    features: Callable[..., None],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The gateway thinks the nodes accept grammars (it will not look again for an hour);
    they refuse one (501 grammar_unsupported) before the first byte: the request is served
    natively, and the next one goes there at once."""
    body = {
        "model": MODEL,
        "messages": messages(JSON_TEXT),
        "response_format": {"type": "json_object"},
    }
    with start_gateway(
        tmp_path_factory,
        [model_entry(stack, tilert_version, stack.nodes[2:])],
        gate={"capabilities_interval_s": 3600},
        classification={"rules": SPILL},
    ) as gateway:
        features(grammar=False)
        first = plain().post(gateway.base_url + "/chat/completions", json=body, timeout=30)
        second = plain().post(gateway.base_url + "/chat/completions", json=body, timeout=30)
        gateway.wait_all_free()
    assert (first.status_code, second.status_code) == (200, 200), (first.text, second.text)
    assert json.loads(first.json()["choices"][0]["message"]["content"]) == json.loads(JSON_TEXT)
    if tilert_version == "0.1.5":
        assert route(first) == route(second) == ("throughput", "response_format")
        return
    assert route(first) == ("throughput", "node_capability")
    assert route(second) == ("throughput", "response_format")
    decodes = sim_get(stack.nodes[2].url, "/sim/records")["decodes"]
    assert [d["status"] for d in decodes if not d["rid"].startswith("pdgwflush")] == [501]


def test_without_spill_a_refused_feature_is_the_clients_error(
    stack: SimStack,
    tilert_version: str,
    features: Callable[..., None],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    body = {"model": MODEL, "messages": messages(TEXT), "logprobs": True}
    with start_gateway(
        tmp_path_factory,
        [model_entry(stack, tilert_version, stack.nodes[2:])],
        gate={"capabilities_interval_s": 3600},
    ) as gateway:
        features(logprobs=False)
        answer = plain().post(gateway.base_url + "/chat/completions", json=body, timeout=30)
        gateway.wait_all_free()
    if tilert_version == "0.1.5":
        assert route(answer) == ("throughput", "logprobs")
        return
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "logprobs_unavailable")


# Orphans --------------------------------------------------------------------------------


def test_an_orphaned_transfer_is_flushed_before_the_node_serves_again(
    stack: SimStack, tilert_version: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A gateway died between a prefill and its decode: the node holds a completed transfer
    nobody will consume. The next gateway flushes it before sending work there, so the next
    request's transfer is neither refused nor written over the orphan (checked by the
    shared fixture: no corruption on any node)."""
    orphan = stack.nodes[2]
    body = tilert_prefill_body({"model": MODEL, "messages": messages("orphan")}, orphan)
    prefill = plain().post(
        stack.prefills[0].url + "/v1/chat/completions",
        json=body,
        headers={"x-request-id": "0rphan0rphan"},
        timeout=30,
    )
    assert prefill.status_code == 200

    def transfer_complete() -> bool:
        records = sim_get(stack.prefills[0].url, "/sim/requests")["transfers"]
        return any(t["outcome"] == "complete" for t in records)

    wait_for(transfer_complete, "the orphaned transfer")
    with start_gateway(tmp_path_factory, [model_entry(stack, tilert_version, [orphan])]) as gateway:
        answer = plain().post(
            gateway.base_url + "/chat/completions",
            json={"model": MODEL, "messages": messages(TEXT)},
            timeout=30,
        )
        gateway.wait_all_free()
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-pd-route"] == "latency"
    assert answer.json()["choices"][0]["message"]["content"] == TEXT
    rids = [d["rid"] for d in sim_get(orphan.url, "/sim/records")["decodes"]]
    assert len(rids) == 2 and rids[0].startswith("pdgwflush")


def test_chat_logprobs_go_on_across_the_seam(
    client: openai.OpenAI, stack: SimStack, tilert_version: str
) -> None:
    """Both nodes die a few tokens into the answer, one after the other: each continuation's
    prefill reports its first token's logprobs, the node the rest, and the entries are the
    uninterrupted answer's, one per token. (0.1.5 nodes have no logprobs: such a request
    is the native path's, whole.)"""

    def entries() -> tuple[tuple[str, str | None], list[tuple[str, float, list[Any]]]]:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages(TEXT), logprobs=True, top_logprobs=2, stream=True
        )
        chunks = list(raw.parse())
        found = [
            (e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs])
            for c in chunks
            if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content
            for e in c.choices[0].logprobs.content
        ]
        return route(raw), found

    where, expected = entries()
    if tilert_version == "0.1.5":
        assert where == ("throughput", "logprobs")
        return
    for node in stack.nodes[:2]:
        sim_post(node.url, "/sim/faults", {"die_after": 3, "count": 1})
    where, got = entries()
    assert where == ("latency", None)
    assert got == expected and len(expected) >= 9
    records = [sim_get(node.url, "/sim/records")["decodes"] for node in stack.nodes[:2]]
    # The uninterrupted answer's decode; then one that died, its continuation that died,
    # and the continuation that finished.
    assert len([d for r in records for d in request_decodes(r)]) == 4
