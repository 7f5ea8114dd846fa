"""A TileRT node that refuses every transfer admission (its receive slot taken), end to end
on both releases: the request fails as `node_busy` within `kv_admission_s`, not after
`kv_transfer_s`; the node is out until the prober has seen it idle and flushed it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from sim.stack import SimStack
from tests.support.deployment import (
    directive,
    latency_model,
    reset,
    sim_get,
    sim_post,
    version_args,
)
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.http import plain

ADMISSION_S = 1.0
TRANSFER_S = 4.0


@pytest.fixture(scope="module")
def stack(tilert_version: str) -> Iterator[SimStack]:
    version = version_args(tilert_version)
    with SimStack(
        nodes=1,
        prefills=1,
        model=["ds"],
        node_args=["--step-ms", "1", *version["node_args"]],
        prefill_args=version["prefill_args"],
    ) as running:
        yield running


@pytest.fixture(scope="module")
def gateway(
    stack: SimStack, tilert_version: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    with start_gateway(
        tmp_path_factory,
        [latency_model(stack, "ds", tilert=tilert_version)],
        gate={"node_cooldown_s": 0.5, "probe_interval_s": 0.05},
        timeouts={"kv_admission_s": ADMISSION_S, "kv_transfer_s": TRANSFER_S},
        admin={"api_key": "operator-secret"},
    ) as running:
        yield running


def chat(gateway: GatewayProcess, text: str) -> httpx.Response:
    body = {"model": "ds", "messages": [{"role": "user", "content": directive(text)}]}
    return plain().post(gateway.base_url + "/chat/completions", json=body, timeout=30)


def test_a_node_refusing_every_admission_is_busy_at_once_and_comes_back(
    stack: SimStack, gateway: GatewayProcess
) -> None:
    node = stack.nodes[0]
    node_id = node.url.removeprefix("http://")
    reset(stack)
    sim_post(node.url, "/sim/faults", {"refuse_transfers": True})
    started = time.monotonic()
    refused = chat(gateway, "never admitted")
    took_s = time.monotonic() - started
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "node_busy"
    assert ADMISSION_S <= took_s < TRANSFER_S, "answered at the admission wait, not the transfer's"
    outcomes = [c["outcome"] for c in sim_get(node.url, "/sim/records")["control"]]
    assert "refused_busy" in outcomes and "complete" not in outcomes

    pool = gateway.wait_all_free(timeout_s=TRANSFER_S + 10, dead=[node_id])
    assert pool["models"]["ds"]["out"] == {node_id: "node_busy"}, "out until flushed"
    plain().delete(node.url + "/sim/faults", timeout=5).raise_for_status()
    reset(stack)  # 0.1.5's connector wrote into the refused slot: a corruption, by design
    gateway.wait_all_free(timeout_s=10)
    reply = chat(gateway, "admitted again")
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == "admitted again"
