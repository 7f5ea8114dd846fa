"""Rules with an objective through a running gateway, on the memory and the Redis gate.

One TileRT node (3 ms a token), one prefill server, and one native decode server whose gap
grows with the requests it runs (2 ms, plus 40 ms for each other one running). The gateway
is told to assume the decode server's gap does not grow with load, so it must learn that
from its own answers: a request with an `itl_ms` objective goes whole to the idle decode
server, moves to the node once the gateway has seen that server slow down under a batch
stream, and comes back once the batch has ended. A request planned for a busy node leaves
the queue at its deadline: for the native way when the rule has one, else with a 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from sim.stack import SimStack
from tests.gate.redis_server import running_redis
from tests.support.classify_fixtures import Sims, held_nodes, say, words
from tests.support.deployment import latency_model
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.stacks import StackPool

MODEL = "sim-objectives"
# Within the decode stall (2 s) that would free the held node, with room on a loaded host
# for the predicted wait of short holds to stay well inside it.
DEADLINE_MS = 1000
CHAT = {"x-workload": "chat"}
RULES = {
    "default": {"name": "pinned", "path": "latency"},
    "rules": [
        {
            "name": "batch",
            "match": {"headers": {"x-workload": "batch"}},
            "path": "throughput",
        },
        {
            "name": "chat",
            "match": {"headers": {"x-workload": "chat"}},
            "objective": {"itl_ms": 20},
        },
        {
            "name": "node-first",
            "match": {"headers": {"x-workload": "node-first"}},
            "objective": {"ttft_ms": DEADLINE_MS},
            "ways": ["tilert", "whole"],
            "max_queue_wait_ms": 20_000,
        },
        {
            "name": "node-only",
            "match": {"headers": {"x-workload": "node-only"}},
            "objective": {"ttft_ms": DEADLINE_MS},
            "ways": ["tilert"],
            "max_queue_wait_ms": 20_000,
        },
    ],
}
ASSUMED = {"itl_ms": 2, "itl_ms_per_running": 0, "tilert_itl_ms": 3, "memory": 8}


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=1,
        prefills=1,
        decodes=1,
        model=[MODEL],
        node_args=["--step-ms", "3"],
        prefill_args=["--itl-ms", "0", "--prefill-ms-per-token", "0"],
        decode_args=["--itl-ms", "2", "--itl-ms-per-running", "40", "--prefill-ms-per-token", "0"],
    )


@pytest.fixture(scope="module", params=["memory", "redis"])
def gateway(
    request: pytest.FixtureRequest, stack: SimStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    prefill, decode = stack.prefills[0], stack.decodes[0]
    model = latency_model(
        stack,
        MODEL,
        throughput={"mode": "pull", "prefill": [prefill.url], "decode": [decode.url]},
        objectives=ASSUMED,
    )
    with contextlib.ExitStack() as resources:
        gate: dict[str, Any] = {"max_queue_wait_ms": 20_000}
        if request.param == "redis":
            redis = resources.enter_context(running_redis())
            gate |= {
                "backend": "redis",
                "redis": {"url": redis.url, "key_prefix": f"obj-{uuid.uuid4().hex[:8]}"},
            }
        yield resources.enter_context(
            start_gateway(tmp_path_factory, [model], gate=gate, classification={"rules": RULES})
        )


def way_of(response: httpx.Response) -> str:
    return response.headers["x-pd-way"].split(";", 1)[0]


async def chat(http: httpx.AsyncClient, headers: dict[str, str], **extra: Any) -> httpx.Response:
    body = {**say(words(20), max_tokens=20, stream=True), "model": MODEL, **extra}
    response = await http.post("/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert "data: [DONE]" in response.text
    return response


@contextlib.asynccontextmanager
async def batch_stream(http: httpx.AsyncClient) -> AsyncIterator[None]:
    """A long native stream on the decode server, until the block ends (then cut)."""
    body = {**say(words(3000), max_tokens=3000, stream=True), "model": MODEL}
    started = asyncio.Event()

    async def read() -> None:
        headers = {"x-workload": "batch"}
        async with http.stream("POST", "/chat/completions", json=body, headers=headers) as response:
            assert response.status_code == 200
            async for _ in response.aiter_bytes():
                started.set()

    reader = asyncio.create_task(read())
    try:
        await asyncio.wait_for(started.wait(), 30)
        yield
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


async def test_a_request_moves_to_a_node_when_the_native_decode_slows_and_back(
    sims: Sims, gateway: GatewayProcess
) -> None:
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as http:
        alone = [await chat(http, CHAT) for _ in range(3)]
        assert [way_of(r) for r in alone] == ["whole"] * 3
        assert alone[0].headers["x-pd-route"] == "throughput"
        assert alone[0].headers["x-pd-native"] == "whole; reason=objective"
        assert alone[0].headers["x-pd-objective"] == "itl_ms=20"
        assert re.match(
            r"^whole; ttft_ms=\d+; itl_ms=[\d.]+; reason=meets$", alone[0].headers["x-pd-way"]
        )

        async with batch_stream(http):
            under_load = [await chat(http, CHAT) for _ in range(4)]
        ways = [way_of(r) for r in under_load]
        # Assumed not to slow, the decode server is tried once under load; what that
        # answer showed sends the next ones to the node.
        assert ways[0] == "whole"
        assert "tilert" in ways[1:3], ways
        node = under_load[ways.index("tilert")]
        assert node.headers["x-pd-route"] == "latency"

        await sims.wait_all_free(gateway)
        back = await chat(http, CHAT)
        assert way_of(back) == "whole"

    timings = (await sims.http.get(gateway.url + "/admin/timings")).json()["models"][MODEL]
    decode = timings["gap_ms"][sims.stack.decodes[0].url]
    assert decode["per_unit"] > 20  # learned: about 40 ms a running request, assumed 0
    assert timings["node_gap_ms"]  # the node's answer taught its gap
    metrics = (await sims.http.get(gateway.url + "/metrics")).text
    missed = re.search(
        rf'pd_gateway_objective_requests_total{{model="{MODEL}",outcome="missed",rule="chat",'
        r'way="whole"} (\S+)',
        metrics,
    )
    assert missed is not None and float(missed.group(1)) >= 1
    assert (
        f'pd_gateway_prediction_error_seconds_count{{model="{MODEL}",quantity="itl",way="whole"}}'
        in metrics
    )


async def short_holds(http: httpx.AsyncClient) -> None:
    """Four quick answers on the node: the pool's holds are known to be short."""
    for _ in range(4):
        await chat(http, {}, max_tokens=4)


async def test_a_waiter_planned_for_a_node_leaves_at_its_deadline_for_the_native_way(
    sims: Sims, gateway: GatewayProcess
) -> None:
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as http:
        await short_holds(http)
        async with held_nodes(gateway, sims, model=MODEL):
            started = time.monotonic()
            answer = await chat(http, {"x-workload": "node-first"})
            waited_s = time.monotonic() - started
    # Short holds predicted a node in time: planned for it, it waited until its deadline
    # (a second less the predicted prefill and hand-off), not its 20 s budget.
    assert way_of(answer) == "tilert"
    assert answer.headers["x-pd-route"] == "throughput"
    assert answer.headers["x-pd-reroute-reason"] == "objective_deadline"
    assert answer.headers["x-pd-native"] == "whole; reason=objective"
    assert waited_s < 10


async def test_a_waiter_with_no_native_way_gets_a_429_at_its_deadline(
    sims: Sims, gateway: GatewayProcess
) -> None:
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as http:
        await short_holds(http)
        async with held_nodes(gateway, sims, model=MODEL):
            started = time.monotonic()
            body = {**say("x", stream=True), "model": MODEL}
            refused = await http.post(
                "/chat/completions", json=body, headers={"x-workload": "node-only"}
            )
            waited_s = time.monotonic() - started
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "objective_deadline"
    assert int(refused.headers["retry-after"]) >= 1
    assert waited_s < 10
