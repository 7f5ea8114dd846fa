"""The gateway in front of TileRT's own node and in front of the simulated one: what it
learns of each (`/admin/pool` node facts), a chat answer streamed and whole, a feature the
node stops supporting refused by the node and believed, a client who leaves mid-stream
(the node cancelled, freed, and serving the next), and an orphaned transfer flushed when a
gateway starts. One gateway per release serves both nodes, as two models (`real`, `sim`)
over the same prefill server; every case runs on each and the answers are compared.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.real_tilert.conftest import KINDS, MAX_SEQ_LEN, Pair, set_engine
from tests.support.deployment import latency_model, sim_get, sim_post
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.http import plain
from tests.support.legs import tilert_prefill_body

TEXT = "The quick brown fox jumps over the lazy dog"
LONG_TEXT = " ".join([TEXT] * 20)
FEATURES = {"logprobs": True}  # reported at the gateway's start, besides `ignore_eos`


def model_entries(pair: Pair, kinds: tuple[str, ...] = KINDS) -> list[dict[str, Any]]:
    """One latency model per node kind, named after it, both over the pair's prefill."""
    entries = []
    for kind in kinds:
        entry = latency_model(pair.stack, kind, nodes=[pair.node(kind)], tilert=pair.release)
        entry["latency"]["max_seq_len"] = MAX_SEQ_LEN
        entries.append(entry)
    return entries


@pytest.fixture(scope="module")
def gateway(pair: Pair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """The release's gateway, which asks the nodes for their features once, at its start."""
    for kind in KINDS:
        if pair.release == "0.1.6":
            pair.capabilities(kind, **FEATURES)
    with start_gateway(
        tmp_path_factory, model_entries(pair), gate={"capabilities_interval_s": 3600}
    ) as running:
        yield running


def chat(gateway: GatewayProcess, body: dict[str, Any]) -> httpx.Response:
    return plain().post(gateway.base_url + "/chat/completions", json=body, timeout=30)


def streamed_content(answer: httpx.Response) -> tuple[str, list[str | None]]:
    """The content of a chat stream, and each choice chunk's finish_reason."""
    chunks = [
        json.loads(event.removeprefix("data: "))
        for event in answer.text.split("\n\n")
        if event.startswith("data: {")
    ]
    choices = [c["choices"][0] for c in chunks if c.get("choices")]
    content = "".join(c["delta"].get("content") or "" for c in choices)
    return content, [c.get("finish_reason") for c in choices if c.get("finish_reason")]


def test_what_the_gateway_learns_of_each_node(pair: Pair, gateway: GatewayProcess) -> None:
    def facts(kind: str) -> dict[str, Any]:
        (found,) = gateway.pool()["models"][kind]["node_facts"].values()
        return {k: v for k, v in found.items() if k != "engine"}  # the engines' own names

    real, sim = (facts(kind) for kind in KINDS)
    assert real == sim
    expected = ["ignore_eos", "logprobs"] if pair.release == "0.1.6" else []
    assert real["tilert"] == pair.release and sorted(real["features"]) == expected


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_chat_answer(pair: Pair, gateway: GatewayProcess, stream: bool) -> None:
    def ask(kind: str) -> tuple[Any, ...]:
        body = {"model": kind, "messages": pair.will_say(kind, TEXT), "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        answer = chat(gateway, body)
        assert answer.status_code == 200, answer.text
        route = answer.headers["x-pd-route"]
        if stream:
            return route, streamed_content(answer)
        data = answer.json()
        choice = data["choices"][0]
        return route, choice["message"]["content"], choice["finish_reason"], data["usage"]

    real, sim = (ask(kind) for kind in KINDS)
    gateway.wait_all_free()
    assert real == sim
    assert real[0] == "latency"
    assert (real[1] if not stream else real[1][0]) == TEXT


def test_a_feature_the_node_stops_supporting_is_refused_and_believed(
    pair: Pair, gateway: GatewayProcess
) -> None:
    """The gateway saw `logprobs` reported at its start and will not ask again for an
    hour; the node's engine loses them: the node refuses the decode (501
    `logprobs_unavailable`), and without a native path the client gets a 400 naming it. A
    0.1.5 node reports no features and refuses nothing: the gateway never sends it a
    request for logprobs, and the client gets the same 400 before any node is asked."""

    def ask(kind: str) -> tuple[int, str, str]:
        pair.capabilities(kind, logprobs=False)
        try:
            body = {"model": kind, "messages": pair.will_say(kind, TEXT), "logprobs": True}
            answer = chat(gateway, body)
            gateway.wait_all_free()
        finally:
            pair.capabilities(kind, logprobs=True)
        error = answer.json()["error"]
        return answer.status_code, error["type"], error["code"]

    real, sim = (ask(kind) for kind in KINDS)
    # 0.1.5: the guard's refusal, a request the latency path cannot honour and no native
    # path to send it to.
    code = "no_throughput_path" if pair.release == "0.1.5" else "logprobs_unavailable"
    assert real == sim == (400, "invalid_request_error", code)


def test_a_client_who_leaves_mid_stream_frees_the_node(pair: Pair, gateway: GatewayProcess) -> None:
    """The client reads the first chunks of a long answer and goes: the gateway cancels
    the node's decode and reads its stream to the end; the node is idle and serves the
    next request."""

    def leave(kind: str) -> tuple[str, str, str]:
        node = pair.node(kind)
        if kind == "real":
            messages = pair.will_say(kind, LONG_TEXT, token_interval_ms=20)
        else:  # the simulated node falls silent after 3 tokens until cancelled
            messages = pair.will_say(kind, LONG_TEXT)
            sim_post(node.url, "/sim/faults", {"stall_after": 3, "count": 1})
        body = {"model": kind, "messages": messages, "stream": True}
        with plain().stream(
            "POST", gateway.base_url + "/chat/completions", json=body, timeout=30
        ) as answer:
            events = answer.iter_lines()
            seen = [next(events) for _ in range(4)]
        assert any('"content"' in line for line in seen), seen
        gateway.wait_all_free()
        status = httpx.get(node.url + "/decode_status", timeout=5).json()["status"]
        if kind == "real":
            set_engine(node.url, token_interval_ms=1)
        after = chat(gateway, {"model": kind, "messages": pair.will_say(kind, TEXT)})
        return status, after.headers["x-pd-route"], after.json()["choices"][0]["message"]["content"]

    real, sim = (leave(kind) for kind in KINDS)
    assert real == sim == ("idle", "latency", TEXT)
    finishes = [
        d["finish_reason"] for d in sim_get(pair.node("sim").url, "/sim/records")["decodes"]
    ]
    assert "cancelled" in finishes


def test_an_orphaned_transfer_is_flushed_when_a_gateway_starts(
    pair: Pair, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A prefill whose gateway died before its decode leaves a complete transfer on each
    node. The next gateway flushes every node before serving (a decode for an id that has
    no transfer: it drops the orphan, then times out): the orphan is dropped on both, and
    the next answer is right."""
    orphans = {kind: uuid.uuid4().hex for kind in KINDS}
    for kind, rid in orphans.items():
        body = {"model": kind, "messages": pair.will_say(kind, "orphan")}
        prefill = plain().post(
            pair.prefill_url + "/v1/chat/completions",
            json=tilert_prefill_body(body, pair.node(kind)),
            headers={"x-request-id": rid},
            timeout=30,
        )
        assert prefill.status_code == 200
    deadline = time.monotonic() + 10
    while not all(transfer_complete(pair, rid) for rid in orphans.values()):
        assert time.monotonic() < deadline, "the orphaned transfers did not complete"
        time.sleep(0.05)  # the prefill server's transfers, seen in its records
    with start_gateway(tmp_path_factory, model_entries(pair)) as gateway:
        answers = [
            chat(gateway, {"model": kind, "messages": pair.will_say(kind, TEXT)}) for kind in KINDS
        ]
        gateway.wait_all_free()
    assert [a.json()["choices"][0]["message"]["content"] for a in answers] == [TEXT, TEXT]
    dropped_by_real = f"dropping unmatched request {orphans['real']} (waiting for pdgwflush"
    assert dropped_by_real in pair.real.log_text()
    records = sim_get(pair.node("sim").url, "/sim/records")
    assert orphans["sim"] in records["stale_dropped"]
    assert [d["rid"][:9] for d in records["decodes"]][-2] == "pdgwflush"


def transfer_complete(pair: Pair, rid: str) -> bool:
    transfers = sim_get(pair.prefill_url, "/sim/requests")["transfers"]
    mine = [t for t in transfers if t["rid"] == rid]
    return bool(mine) and all(t["outcome"] == "complete" for t in mine)
