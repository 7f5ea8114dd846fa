"""`latency.prefill_input: token_ids` end to end against the simulators: the gateway proves
the prefill server's rendering at its `/tokenize`, then sends chat prompts as ids, and the
client sees the same answers as with `text`."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sim.stack import SimStack
from tests.real_vllm.compare import exchange
from tests.support.deployment import directive, latency_model, sim_get
from tests.support.gateway import GatewayProcess, start_gateway

pytestmark = pytest.mark.e2e

GLM = Path(__file__).resolve().parents[2] / "sim" / "fixtures" / "glm"
MODEL = "sim-model"


@pytest.fixture(scope="module")
def stack() -> Iterator[SimStack]:
    with SimStack(nodes=1, prefills=1, tokenizer=str(GLM), model=MODEL) as stack:
        yield stack


@pytest.fixture(scope="module")
def gateways(
    stack: SimStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, GatewayProcess]]:
    def model(prefill_input: str) -> dict[str, Any]:
        entry = latency_model(stack, MODEL, tokenizer=str(GLM))
        entry["latency"]["prefill_input"] = prefill_input
        return entry

    with start_gateway(tmp_path_factory, [model("text")]) as text:
        with start_gateway(tmp_path_factory, [model("token_ids")]) as token_ids:
            yield {"text": text, "token_ids": token_ids}


def _counted(client: httpx.Client, gateway: GatewayProcess, name: str) -> dict[str, float]:
    page = client.get(f"{gateway.url}/metrics").text
    found = re.findall(rf"^{name}_total\{{(.*)\}} (\S+)$", page, flags=re.MULTILINE)
    return {labels: float(value) for labels, value in found}


def test_the_simulator_prefills_the_ids_it_is_given(stack: SimStack) -> None:
    url = stack.prefills[0].url
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hello there."}]}
    with httpx.Client(timeout=30) as client:
        rendered = client.post(f"{url}/tokenize", json=chat).json()["tokens"]
        answer = client.post(
            f"{url}/v1/chat/completions",
            json={
                **chat,
                "max_tokens": 1,
                "kv_transfer_params": {"prompt_token_ids": rendered * 2},
            },
        )
        refused = client.post(
            f"{url}/v1/chat/completions",
            json={**chat, "max_tokens": 1, "kv_transfer_params": {"prompt_token_ids": []}},
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] == 2 * len(rendered)
    assert refused.status_code == 400


def test_token_ids_answer_as_text(stack: SimStack, gateways: dict[str, GatewayProcess]) -> None:
    ids_gateway = gateways["token_ids"]
    messages = [
        {"role": "system", "content": "Be brief. 速度 🌍"},
        {"role": "user", "content": directive("The Seine, in Paris.")},
    ]
    body = {"model": MODEL, "messages": messages, "max_tokens": 12, "temperature": 0}
    with httpx.Client(timeout=60) as client:
        # The first request has the prefill server proven, in the background.
        assert exchange(client, ids_gateway.url, "/v1/chat/completions", body).status == 200
        deadline = time.monotonic() + 30
        while not _counted(client, ids_gateway, "pd_gateway_prefill_token_ids_proofs"):
            assert time.monotonic() < deadline, "the prefill server was never proven"
            time.sleep(0.05)  # the proof runs inside the gateway's process
        verdicts = _counted(client, ids_gateway, "pd_gateway_prefill_token_ids_proofs")
        assert list(verdicts) == [
            f'model="{MODEL}",server="{stack.prefills[0].url}",verdict="identical"'
        ]
        for stream in (False, True):
            request = {**body, "stream": stream}
            text = exchange(client, gateways["text"].url, "/v1/chat/completions", request)
            ids = exchange(client, ids_gateway.url, "/v1/chat/completions", request)
            assert text.status == ids.status == 200, (text.body, ids.body)
            assert ids.body == text.body
        inputs = _counted(client, ids_gateway, "pd_gateway_prefill_inputs")
    assert inputs == {f'input="text",model="{MODEL}"': 1, f'input="token_ids",model="{MODEL}"': 2}
    sent = [r["body"] for r in sim_get(stack.prefills[0].url, "/sim/requests")["requests"]]
    prefills = [b["kv_transfer_params"] for b in sent if "tilert_host" in b["kv_transfer_params"]]
    assert ["prompt_token_ids" in p for p in prefills] == [False, False, True, False, True]
