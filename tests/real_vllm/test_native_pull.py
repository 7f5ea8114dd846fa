"""The native path in pull mode over a real vLLM producer/consumer pair (vLLM's
`ExampleConnector`, which hands the KV over through shared storage): the gateway runs the
prefill leg on the producer and the decode leg on the consumer, and what reaches the
client is what the consumer says to the same request sent to it directly. A request whose
rule's objective the consumer meets alone is served whole there, the producer untouched.
A decode stream cut short mid-answer goes on on the consumer, sent the prompt and the
output so far as ids: the client gets the uninterrupted answer."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.real_vllm.cases import chat, completion
from tests.real_vllm.compare import both_ways, exchange
from tests.real_vllm.conftest import require_vllm
from tests.real_vllm.server import VllmServer
from tests.support.cutting_proxy import CuttingProxy
from tests.support.gateway import GatewayProcess, start_gateway

CASES = {
    "chat": chat(),
    "chat stream with usage": chat(stream=True, stream_options={"include_usage": True}),
    "completion": completion(),
    "completion stream": completion(stream=True),
    "prompt scoring": completion(echo=True, logprobs=1, max_tokens=0),
}


def connector(role: str, storage: Path) -> list[str]:
    config = {
        "kv_connector": "ExampleConnector",
        "kv_role": role,
        "kv_connector_extra_config": {"shared_storage_path": str(storage)},
    }
    return ["--kv-transfer-config", json.dumps(config)]


@pytest.fixture(scope="module")
def pair(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[VllmServer, VllmServer]]:
    require_vllm()
    workdir = tmp_path_factory.mktemp("pull-pair")
    producer, consumer = (
        VllmServer(tiny_model_dir, workdir / f"{role}.log", connector(role, workdir / "kv"))
        for role in ("kv_producer", "kv_consumer")
    )
    try:
        for server in (producer.launch(), consumer.launch()):  # both start side by side
            server.ready()
        yield producer, consumer
    finally:
        producer.stop()
        consumer.stop()


@pytest.fixture(scope="module")
def gateway(
    pair: tuple[VllmServer, VllmServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    producer, consumer = pair
    model = {
        "name": consumer.model,
        "tokenizer": str(consumer.model_dir),
        "throughput": {"mode": "pull", "prefill": [producer.url], "decode": [consumer.url]},
    }
    with start_gateway(tmp_path_factory, [model], classification={"rules": RULES}) as gateway:
        yield gateway


OBJECTIVE_USER = "by-objective"
RULES = {
    "rules": [
        {
            "name": "objective",
            "match": {"user": OBJECTIVE_USER},
            # Generous: every way meets it, so the cheapest is taken.
            "objective": {"ttft_ms": 600_000, "itl_ms": 60_000},
            "ways": ["whole", "split"],
        }
    ]
}


def finished(server: VllmServer) -> float:
    """The requests `server` has finished, as its own /metrics counts them."""
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return sum(
        float(m.group(1))
        for m in re.finditer(r"^vllm:request_success_total\{[^}]*\} (\S+)$", text, re.M)
    )


@pytest.mark.parametrize("case", CASES)
def test_the_pulled_answer_is_the_consumers(
    case: str, pair: tuple[VllmServer, VllmServer], gateway: GatewayProcess
) -> None:
    path, body = CASES[case]
    _, consumer = pair
    with httpx.Client(timeout=120) as client:
        direct, pulled = both_ways(client, consumer.url, gateway.url, path, body)
    assert direct.status == 200, direct.body
    assert pulled == direct


def test_the_consumer_loads_what_the_producer_stored(
    pair: tuple[VllmServer, VllmServer], gateway: GatewayProcess
) -> None:
    path, body = CASES["chat"]
    with httpx.Client(timeout=120) as client:
        assert exchange(client, gateway.url, path, body).status == 200
    producer, consumer = pair
    stored = producer.log_path.parent / "kv"
    assert any(stored.rglob("*.safetensors")), producer.log_tail()
    assert "External Cache Hit" in consumer.log_path.read_text(errors="replace")


def test_an_objective_the_decode_server_meets_alone_is_served_whole_there(
    pair: tuple[VllmServer, VllmServer], gateway: GatewayProcess
) -> None:
    producer, consumer = pair
    path, body = CASES["chat stream with usage"]
    body = {**body, "user": OBJECTIVE_USER}
    before = finished(producer)
    with httpx.Client(timeout=120) as client:
        direct, whole = both_ways(client, consumer.url, gateway.url, path, body)
        headers = client.post(gateway.url + path, json=body).headers
    assert direct.status == 200, direct.body
    assert whole == direct
    assert headers["x-pd-way"].startswith("whole; ") and headers["x-pd-way"].endswith(
        "reason=meets"
    )
    assert headers["x-pd-native"] == "whole; reason=objective"
    assert finished(producer) == before  # no prefill leg


@pytest.fixture(scope="module")
def cutter(pair: tuple[VllmServer, VllmServer]) -> Iterator[CuttingProxy]:
    """The consumer behind a proxy that cuts the first chat answer after 2 kB."""
    _, consumer = pair
    where = urlsplit(consumer.url)
    assert where.hostname is not None and where.port is not None
    prefix = b"POST /v1/chat/completions"
    with CuttingProxy(where.hostname, where.port, prefix=prefix, after=2048) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def cut_gateway(
    pair: tuple[VllmServer, VllmServer],
    cutter: CuttingProxy,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    producer, consumer = pair
    model = {
        "name": consumer.model,
        "tokenizer": str(consumer.model_dir),
        "throughput": {"mode": "pull", "prefill": [producer.url], "decode": [cutter.url]},
    }
    rules = {"default": {"name": "native", "path": "throughput"}}
    with start_gateway(tmp_path_factory, [model], classification={"rules": rules}) as gateway:
        yield gateway


def streamed(seen: Any) -> tuple[str, list[str], dict[str, Any]]:
    """A chat stream's text, finish reasons and usage."""
    chunks = [c for c in seen.body if isinstance(c, dict)]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    [usage] = [c["usage"] for c in chunks if not c["choices"]]
    return text, [f for f in finishes if f], usage


def test_a_decode_stream_cut_mid_answer_goes_on_unseen(
    gateway: GatewayProcess, cut_gateway: GatewayProcess, cutter: CuttingProxy
) -> None:
    path, body = chat(
        stream=True, stream_options={"include_usage": True}, max_tokens=64, ignore_eos=True
    )
    with httpx.Client(timeout=120) as client:
        whole = exchange(client, gateway.url, path, body)
        cut = exchange(client, cut_gateway.url, path, body)
    assert cutter.cuts == 1
    assert (whole.status, cut.status) == (200, 200)
    assert streamed(cut) == streamed(whole)
    assert len(streamed(whole)[0]) > 20
