"""The pools' recommended sizes from a running gateway under load: more latency streams than
TileRT nodes make the pool recommend more nodes than it has; native answers give the
prefill and decode servers figures; the same figures are on /metrics for the autoscalers.

Two nodes (5 ms a token, so a 60-token answer holds one for a third of a second or more), a
prefill server and a native decode server; sizing averaged over 10 s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sim.stack import SimStack
from tests.support.classify_fixtures import say, words
from tests.support.deployment import latency_model
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.stacks import StackPool

pytestmark = pytest.mark.e2e

MODEL = "sim-sizing"
BATCH = {"x-workload": "batch"}
RULES = {
    "default": {"name": "chat", "path": "latency"},
    "rules": [{"name": "batch", "match": {"headers": BATCH}, "path": "throughput"}],
}


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=2, prefills=1, decodes=1, model=[MODEL], node_args=["--step-ms", "5"]
    )


@pytest.fixture(scope="module")
def gateway(stack: SimStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    prefill, decode = stack.prefills[0], stack.decodes[0]
    model = latency_model(
        stack,
        MODEL,
        throughput={"mode": "pull", "prefill": [prefill.url], "decode": [decode.url]},
        sizing={"window_s": 10, "tilert_wait_ms": 100, "tilert_wait_share": 0.05},
    )
    with start_gateway(tmp_path_factory, [model], classification={"rules": RULES}) as gateway:
        yield gateway


async def answer(http: httpx.AsyncClient, headers: dict[str, str] | None = None) -> None:
    body = {**say(words(60), max_tokens=60, stream=True), "model": MODEL}
    response = await http.post("/chat/completions", json=body, headers=headers or {})
    assert response.status_code == 200, response.text
    assert "data: [DONE]" in response.text


async def sizes(http: httpx.AsyncClient, gateway: GatewayProcess) -> dict[str, Any]:
    response = await http.get(gateway.url + "/admin/sizing", headers=gateway.admin_headers)
    response.raise_for_status()
    models: dict[str, Any] = response.json()["models"]
    return models.get(MODEL, {})


async def test_more_streams_than_nodes_make_the_pool_recommend_more_nodes(
    gateway: GatewayProcess,
) -> None:
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as http:
        seen: dict[str, Any] = {}
        stop = asyncio.Event()

        async def client() -> None:
            while not stop.is_set():
                await answer(http)

        clients = [asyncio.create_task(client()) for _ in range(6)]  # three per node
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                seen = await sizes(http, gateway)
                tilert = seen.get("tilert")
                if tilert is not None and tilert["demand"] > 2 and tilert["recommended"] > 2:
                    break
                await asyncio.sleep(0.2)  # polling the figures, not waiting for them
        finally:
            stop.set()
            await asyncio.gather(*clients)
        tilert = seen["tilert"]
        assert tilert["current"] == 2
        assert tilert["demand"] > 2, seen  # the six clients: more than the nodes keep up with
        assert tilert["recommended"] >= 3, seen
        assert tilert["basis"]["waiting"] > 0
        assert 0 < tilert["basis"]["hold_s"] < 10
        gateway.wait_all_free()


async def test_native_answers_give_the_prefill_and_decode_servers_figures(
    gateway: GatewayProcess,
) -> None:
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as http:
        seen: dict[str, Any] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            await asyncio.gather(*(answer(http, BATCH) for _ in range(4)))
            seen = await sizes(http, gateway)
            if "prefill" in seen and seen["prefill"]["basis"]["tokens_per_s"] > 0:
                break
        prefill, decode = seen["prefill"], seen["decode"]
        assert prefill["current"] == decode["current"] == 1
        assert prefill["demand"] > 0 and prefill["recommended"] >= 1, seen
        assert prefill["basis"]["prefills_per_s"] > 0
        # The decode server's gap, as measured: the most it runs within the target (-1: its
        # gap does not grow with the requests it runs, so one runs them all).
        assert decode["basis"]["gap_ms_one_running"] > 0
        per_server = decode["basis"]["running_per_server"]
        assert per_server == -1 or per_server >= 1
        metrics = (await http.get(gateway.url + "/metrics")).text
    for pool in ("tilert", "prefill", "decode"):
        for name in ("current", "demand", "recommended"):
            series = f'pd_gateway_sizing_{name}_replicas{{model="{MODEL}",pool="{pool}"}}'
            assert series in metrics, series
