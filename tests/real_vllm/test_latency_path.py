"""The latency path with a real vLLM prefill: vLLM runs the one-token prefill, its KV
connector (sim.tilert_kv_connector, loaded through `--kv-transfer-config`) runs TileRT's
control exchange with a simulated decode node, and the gateway relays the node's decode.

The node's tokens are not the model's, so the content differs from what vLLM alone would
say; everything around it must be shaped as vLLM shapes it: the same keys in the same
order, the same types, the same events, with the differences listed in the README
("Conformance with vLLM") and in `KNOWN` below, each with its reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sim.stack import SimStack
from tests.real_vllm.cases import chat, completion, response
from tests.real_vllm.compare import (
    exchange,
    shape_differences,
    stream_ending,
    stream_outline,
    textless,
)
from tests.real_vllm.conftest import ConnectorVllm
from tests.real_vllm.server import VllmServer
from tests.support.deployment import node_entry
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.tiny_model import MAX_MODEL_LEN

LATENCY_HEADER = "x-pd-path"
USAGE = {"include_usage": True}
CASES = {
    "chat": chat(),
    "chat stream": chat(stream=True),
    "chat stream with usage": chat(stream=True, stream_options=USAGE),
    "completion": completion(),
    "completion stream": completion(stream=True, stream_options=USAGE),
    "response": response(),
    "response stream": response(stream=True),
}

# The differences the README lists ("Conformance with vLLM"), as this test finds them.
FINISH_IN_ITS_OWN_CHUNK = "[2].choices[0].delta.content: only vLLM sends it"
KNOWN = {
    "chat stream": [FINISH_IN_ITS_OWN_CHUNK],
    "chat stream with usage": [FINISH_IN_ITS_OWN_CHUNK],
}


@pytest.fixture(scope="module")
def prefill(connector_vllm: ConnectorVllm) -> VllmServer:
    return connector_vllm.server


@pytest.fixture(scope="module")
def node(tiny_model_dir: Path) -> Iterator[SimStack]:
    node_args = ["--no-data-plane", "--senders", "1", "--max-seq-len", str(MAX_MODEL_LEN)]
    with SimStack(nodes=1, prefills=0, tokenizer=str(tiny_model_dir), node_args=node_args) as stack:
        yield stack


@pytest.fixture(scope="module")
def gateway(
    prefill: VllmServer, node: SimStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    model = {
        "name": prefill.model,
        "tokenizer": str(prefill.model_dir),
        "latency": {
            "tilert": "0.1.6",
            "prefill": [prefill.url],
            "nodes": [node_entry(n) for n in node.nodes],
            "max_seq_len": MAX_MODEL_LEN,
        },
    }
    with start_gateway(tmp_path_factory, [model]) as gateway:
        yield gateway


@pytest.mark.parametrize("case", CASES)
def test_the_latency_answer_is_shaped_as_vllms(
    case: str, prefill: VllmServer, gateway: GatewayProcess
) -> None:
    path, body = CASES[case]
    with httpx.Client(timeout=120) as client:
        direct = exchange(client, prefill.url, path, body)
        relayed = exchange(client, gateway.url, path, body)
    assert direct.status == relayed.status == 200, (direct.body, relayed.body)
    assert relayed.content_type == direct.content_type
    if relayed.content_type == "text/event-stream":
        direct_outline, relayed_outline = stream_outline(direct.body), stream_outline(relayed.body)
        assert shape_differences(direct_outline, relayed_outline) == KNOWN.get(case, [])
        assert stream_ending(relayed.body) == stream_ending(direct.body)
    else:
        assert shape_differences(direct.body, relayed.body) == []
        assert textless(relayed.body) == textless(direct.body)
