"""The native path over real NIXL: a prefill and a decode vLLM server with vLLM's own NIXL
connectors (NIXL's UCX backend moving host memory between the two processes: the CPU
build needs no GPU for it), the gateway in front. In `pull` mode (`NixlConnector`) the
gateway prefills, carries the producer's `kv_transfer_params` to the decode server, and
that server reads the blocks; in `push` mode (`NixlPushConnector`) the decode server,
named the prefill engine, allocates its blocks and the prefill writes into them.

What the client gets through the gateway is what the pair says when driven by hand, the
same legs sent straight to the two servers (`by_hand`), and the decode server says, by its
own counters, that it loaded the prompt from the prefill and computed none of it. A request
the pair cannot split (prompt scoring), or whose rule's objective the decode server meets
alone, is what the decode server says to it sent directly, the prefill untouched for the
objective; a decode stream cut short mid-answer goes on on the decode server, sent the
prompt and the output so far as ids, and the client gets the uninterrupted answer. NIXL is
installed apart (`python -m tests.real_vllm.nixl_install`); each mode's pair starts once,
the pull pair stopped before the push pair starts.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from sim.vllm.nixl import producer_params
from tests.real_vllm.cases import chat, completion
from tests.real_vllm.compare import Seen, both_ways, exchange, rejoined
from tests.real_vllm.conftest import BLOCK, require_vllm
from tests.real_vllm.install import vllm_python
from tests.real_vllm.nixl_install import nixl_ready, nixl_site
from tests.real_vllm.server import VllmServer
from tests.support.cutting_proxy import CuttingProxy
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.ports import unclaimed_port

PROGRESS_SHIM = Path(__file__).with_name("nixl_progress")
CONNECTORS = {"pull": "NixlConnector", "push": "NixlPushConnector"}
# NIXL registers every block of the KV cache with UCX and each server hands the other the
# list at the handshake: a few hundred blocks, not the 65536 the cache's 1 GiB holds.
KV_BLOCKS = 256
# How long a prefill keeps finished blocks for a decode that has not read them (vLLM's
# 30 s is short for two servers and a gateway on a busy 2-core machine).
LEASE_S = 300
STORY = (
    "Tell me a story about a city, a river and a bridge that nobody crossed, "
    "and explain why the sky is blue at noon while the weather in Paris stays mild. "
)
MESSAGES = [{"role": "user", "content": STORY * 2}]  # some 90 tokens: three blocks
CASES = {
    "chat": chat(messages=MESSAGES),
    "chat stream with usage": chat(
        messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    ),
    "completion": completion(prompt=STORY * 2),
    "completion stream": completion(prompt=STORY * 2, stream=True),
}


def require_nixl() -> None:
    """Fail, saying what to run, when NIXL is not installed for the tier."""
    require_vllm()
    if not nixl_ready(vllm_python(), nixl_site()):
        pytest.fail(
            f"NIXL is not installed in {nixl_site()}: run `python -m tests.real_vllm.nixl_install`",
            pytrace=False,
        )


@dataclass(frozen=True)
class NixlPair:
    mode: str
    prefill: VllmServer
    decode: VllmServer
    engine_id: str  # the prefill's
    side_channel_port: int  # the prefill's


def nixl_server(model_dir: Path, log: Path, mode: str, role: str) -> tuple[VllmServer, str, int]:
    """A server with `mode`'s NIXL connector as `role`; its engine id and side channel port."""
    engine_id, port = f"{mode}-{role}-{uuid.uuid4().hex[:8]}", unclaimed_port()
    config = {
        "kv_connector": CONNECTORS[mode],
        "kv_role": role,
        "kv_buffer_device": "cpu",
        "engine_id": engine_id,
        "kv_connector_extra_config": {"kv_lease_duration": LEASE_S},
    }
    args = [
        "--kv-transfer-config",
        json.dumps(config),
        "--block-size",
        str(BLOCK),
        "--num-gpu-blocks-override",
        str(KV_BLOCKS),
        "--enable-prompt-tokens-details",  # cached_tokens, which the gateway rewrites
    ]
    env = {
        # NIXL's progress thread sleeps between idle polls (nixl_progress/sitecustomize.py).
        "PYTHONPATH": os.pathsep.join([str(PROGRESS_SHIM), str(nixl_site())]),
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(port),
    }
    return VllmServer(model_dir, log, args, env), engine_id, port


@pytest.fixture(scope="module", params=list(CONNECTORS))
def pair(
    request: pytest.FixtureRequest,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[NixlPair]:
    require_nixl()
    mode: str = request.param
    workdir = tmp_path_factory.mktemp(f"nixl-{mode}")
    prefill, engine_id, port = nixl_server(
        tiny_model_dir, workdir / "prefill.log", mode, "kv_producer"
    )
    decode, _, _ = nixl_server(tiny_model_dir, workdir / "decode.log", mode, "kv_consumer")
    try:
        for server in (prefill.launch(), decode.launch()):  # both start side by side
            server.ready()
        yield NixlPair(mode, prefill, decode, engine_id, port)
    finally:
        prefill.stop()
        decode.stop()


@pytest.fixture(scope="module")
def gateway(pair: NixlPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    model = native_model(pair, pair.decode.url)
    with start_gateway(tmp_path_factory, [model], classification={"rules": RULES}) as gateway:
        yield gateway


def native_model(pair: NixlPair, decode_url: str) -> dict[str, Any]:
    """The pair as the model's native path in the pair's mode, decoding at `decode_url`."""
    prefill: Any = [pair.prefill.url]
    if pair.mode == "push":
        prefill = [
            {
                "url": pair.prefill.url,
                "engine_id": pair.engine_id,
                "side_channel_host": "127.0.0.1",
                "side_channel_port": pair.side_channel_port,
            }
        ]
    return {
        "name": pair.decode.model,
        "tokenizer": str(pair.decode.model_dir),
        "throughput": {"mode": pair.mode, "prefill": prefill, "decode": [decode_url]},
    }


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
    ],
    "default": {"name": "native", "path": "throughput"},
}


def prefill_leg(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill leg as vLLM's own disaggregation proxy sends it."""
    out = {k: v for k, v in body.items() if k != "stream_options"}
    params = {"do_remote_decode": True, "do_remote_prefill": False}
    return {**out, "max_tokens": 1, "stream": False, "kv_transfer_params": params}


def by_hand(pair: NixlPair, path: str, body: dict[str, Any]) -> Seen:
    """The decode leg's answer to `body` with the pair driven straight: pull, the prefill's
    `kv_transfer_params` carried over; push, the decode leg first, naming the prefill
    engine, and the prefill beside it, both under one request id."""
    headers = {"X-Request-Id": uuid.uuid4().hex}
    with (
        httpx.Client(timeout=120, headers=headers) as prefill,
        httpx.Client(timeout=120, headers=headers) as decode,
    ):
        if pair.mode == "pull":
            answer = prefill.post(pair.prefill.url + path, json=prefill_leg(body))
            assert answer.status_code == 200, answer.text
            params = answer.json()["kv_transfer_params"]
            return exchange(decode, pair.decode.url, path, {**body, "kv_transfer_params": params})
        params = {
            "do_remote_decode": False,
            "do_remote_prefill": True,
            "remote_engine_id": pair.engine_id,
            "remote_host": "127.0.0.1",
            "remote_port": pair.side_channel_port,
            "tp_size": 1,
            "pp_size": 1,
            "remote_request_id": headers["X-Request-Id"],
        }
        with ThreadPoolExecutor(1) as pool:
            decoded = pool.submit(
                exchange, decode, pair.decode.url, path, {**body, "kv_transfer_params": params}
            )
            answer = prefill.post(pair.prefill.url + path, json=prefill_leg(body))
            assert answer.status_code == 200, answer.text
            seen = decoded.result()
    # The one difference: a push decode server is not told the prefill's cache hits and
    # counts the whole prompt as cached, where the gateway reports the prefill's own (as
    # vLLM's pull decode does, from `remote_prefill_cached_tokens`).
    prefill_cached = answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    return Seen(seen.status, seen.content_type, cached_tokens(seen.body, prefill_cached))


def cached_tokens(value: Any, cached: int) -> Any:
    """`value` (an answer, or a stream's events) with the prompt's cached tokens set to
    `cached` in each usage, once checked to be the whole prompt."""
    if isinstance(value, list):
        return [cached_tokens(v, cached) for v in value]
    usage = value.get("usage") if isinstance(value, dict) else None
    if not usage:
        return value
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"]
    details = {**usage["prompt_tokens_details"], "cached_tokens": cached}
    return {**value, "usage": {**usage, "prompt_tokens_details": details}}


def alike(pair: NixlPair, gateway: GatewayProcess, path: str, body: Any) -> tuple[Seen, Seen]:
    """The pair's answer by hand and the gateway's (as `compare.both_ways`: a stream that
    vLLM cut otherwise is asked again, twice at most, then compared rejoined)."""
    with httpx.Client(timeout=120) as client:
        for _ in range(3):
            direct = by_hand(pair, path, body)
            relayed = exchange(client, gateway.url, path, body)
            if direct == relayed or direct.content_type != "text/event-stream":
                return direct, relayed
    return rejoined(direct), rejoined(relayed)


SOURCE = re.compile(r'^vllm:prompt_tokens_by_source_total\{[^}]*source="(\w+)"[^}]*\} (\S+)$', re.M)
FAILED = re.compile(
    r"^vllm:nixl_num_failed_(?:transfers|notifications)_total\{[^}]*\} (\S+)$", re.M
)


def prompt_sources(server: VllmServer) -> dict[str, float]:
    """The prompt tokens `server` has taken in, by where they came from, as its /metrics
    count them: `local_compute`, `local_cache_hit`, `external_kv_transfer`."""
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return {m.group(1): float(m.group(2)) for m in SOURCE.finditer(text)}


def nixl_failures(server: VllmServer) -> float:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return sum(float(m.group(1)) for m in FAILED.finditer(text))


@pytest.mark.parametrize("case", CASES)
def test_the_gateways_answer_is_the_pairs(
    case: str, pair: NixlPair, gateway: GatewayProcess
) -> None:
    path, body = CASES[case]
    failed_before = nixl_failures(pair.decode) + nixl_failures(pair.prefill)
    direct, relayed = alike(pair, gateway, path, body)
    assert direct.status == 200, direct.body
    failed = nixl_failures(pair.decode) + nixl_failures(pair.prefill) - failed_before
    assert relayed == direct, f"NIXL transfers and notifications failed meanwhile: {failed:g}"


def test_the_decode_server_loads_the_prompt_from_the_prefill(
    pair: NixlPair, gateway: GatewayProcess
) -> None:
    path, body = CASES["chat"]
    before = prompt_sources(pair.decode)
    with httpx.Client(timeout=120) as client:
        seen = exchange(client, gateway.url, path, body)
    assert seen.status == 200, seen.body
    prompt = seen.body["usage"]["prompt_tokens"]
    assert prompt > 2 * BLOCK
    deadline = time.monotonic() + 30
    while True:  # vLLM counts once the answer is out
        after = prompt_sources(pair.decode)
        loaded = after["external_kv_transfer"] - before["external_kv_transfer"]
        if loaded >= prompt or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert loaded == prompt, pair.decode.log_tail()
    assert after["local_compute"] == before["local_compute"]  # not one token recomputed
    assert (nixl_failures(pair.prefill), nixl_failures(pair.decode)) == (0, 0)


def test_the_producer_answers_the_parameters_the_simulator_does(pair: NixlPair) -> None:
    """vLLM's producer parameters have the simulated producer's keys, in its order (in push
    mode less the pinned blocks' expiry, which only a pull decode reads)."""
    path, body = CASES["chat"]
    answer = httpx.post(pair.prefill.url + path, json=prefill_leg(body), timeout=120).json()
    params = answer["kv_transfer_params"]
    simulated = producer_params("e", "127.0.0.1", 1, "r", answer["usage"]["prompt_tokens"])
    keys = [k for k in simulated if pair.mode == "pull" or k != "remote_blocks_expiry_time"]
    assert list(params) == keys
    assert params["transfer_mode"] == pair.mode
    prompt = answer["usage"]["prompt_tokens"]
    [blocks] = params["remote_block_ids"]  # one KV cache group: the blocks the prefill had
    assert len(set(blocks)) == len(blocks) == -(-prompt // BLOCK)
    assert all(isinstance(block, int) for block in blocks)
    assert params["remote_num_tokens"] == prompt


def finished(server: VllmServer) -> float:
    """The requests `server` has finished, as its own /metrics counts them."""
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return sum(
        float(m.group(1))
        for m in re.finditer(r"^vllm:request_success_total\{[^}]*\} (\S+)$", text, re.M)
    )


def test_prompt_scoring_is_the_decode_servers_answer(
    pair: NixlPair, gateway: GatewayProcess
) -> None:
    path, body = completion(prompt=STORY, echo=True, logprobs=1, max_tokens=0)
    with httpx.Client(timeout=120) as client:
        direct, relayed = both_ways(client, pair.decode.url, gateway.url, path, body)
    assert direct.status == 200, direct.body
    assert relayed == direct


def test_an_objective_the_decode_server_meets_alone_is_served_whole_there(
    pair: NixlPair, gateway: GatewayProcess
) -> None:
    path, body = CASES["chat stream with usage"]
    body = {**body, "user": OBJECTIVE_USER}
    before = finished(pair.prefill)
    with httpx.Client(timeout=120) as client:
        direct, whole = both_ways(client, pair.decode.url, gateway.url, path, body)
        headers = client.post(gateway.url + path, json=body).headers
    assert direct.status == 200, direct.body
    assert whole == direct
    assert headers["x-pd-way"].startswith("whole; ") and headers["x-pd-way"].endswith(
        "reason=meets"
    )
    assert headers["x-pd-native"] == "whole; reason=objective"
    assert finished(pair.prefill) == before  # no prefill leg


@pytest.fixture(scope="module")
def cutter(pair: NixlPair) -> Iterator[CuttingProxy]:
    """The decode server behind a proxy that cuts the first chat answer after 2 kB."""
    where = urlsplit(pair.decode.url)
    assert where.hostname is not None and where.port is not None
    prefix = b"POST /v1/chat/completions"
    with CuttingProxy(where.hostname, where.port, prefix=prefix, after=2048) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def cut_gateway(
    pair: NixlPair, cutter: CuttingProxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    model = native_model(pair, cutter.url)
    with start_gateway(tmp_path_factory, [model], classification={"rules": RULES}) as gateway:
        yield gateway


def streamed(seen: Seen) -> tuple[str, list[str], dict[str, Any]]:
    """A chat stream's text, finish reasons and usage: of the prompt's details, the cached
    tokens (a continued answer reports no more: the README's Conformance with vLLM)."""
    chunks = [c for c in seen.body if isinstance(c, dict)]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    [usage] = [c["usage"] for c in chunks if not c["choices"]]
    cached = {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]}
    return text, [f for f in finishes if f], {**usage, "prompt_tokens_details": cached}


def test_a_decode_stream_cut_mid_answer_goes_on_unseen(
    gateway: GatewayProcess, cut_gateway: GatewayProcess, cutter: CuttingProxy
) -> None:
    path, body = chat(
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=64,
        ignore_eos=True,
    )
    with httpx.Client(timeout=120) as client:
        whole = exchange(client, gateway.url, path, body)
        cut = exchange(client, cut_gateway.url, path, body)
    assert cutter.cuts == 1
    assert (whole.status, cut.status) == (200, 200)
    assert streamed(cut) == streamed(whole)
    assert len(streamed(whole)[0]) > 20
