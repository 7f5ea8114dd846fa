"""The simulated vLLM server's health and the faults that make it down, slow or refusing."""

import time

import httpx
import pytest

from sim.stack import ServerInfo, SimStack
from tests.support.stacks import StackPool

from .sim_support import wait_until

pytestmark = pytest.mark.e2e

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
FAST = ["--itl-ms", "0", "--prefill-ms-per-token", "0"]


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(nodes=0, prefills=0, proxy=True, proxy_args=FAST)


@pytest.fixture
def server(stack: SimStack) -> ServerInfo:
    assert stack.proxy is not None
    return stack.proxy


async def test_health_is_an_empty_200(client: httpx.AsyncClient, server: ServerInfo) -> None:
    response = await client.get(f"{server.url}/health")
    assert response.status_code == 200
    assert response.content == b""


async def test_health_503_downs_health_and_api_until_cleared(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    await client.post(f"{server.url}/sim/faults", json={"health_503": True})
    health = await client.get(f"{server.url}/health")
    assert (health.status_code, health.content) == (503, b"")
    chat = await client.post(f"{server.url}/v1/chat/completions", json=CHAT)
    assert chat.status_code == 503
    assert chat.json()["error"]["code"] == 503
    models = await client.get(f"{server.url}/v1/models")
    assert models.status_code == 503
    await client.delete(f"{server.url}/sim/faults")
    assert (await client.get(f"{server.url}/health")).status_code == 200
    assert (await client.post(f"{server.url}/v1/chat/completions", json=CHAT)).status_code == 200


async def test_health_503_with_a_count(client: httpx.AsyncClient, server: ServerInfo) -> None:
    await client.post(f"{server.url}/sim/faults", json={"health_503": True, "count": 2})
    statuses = [(await client.get(f"{server.url}/health")).status_code for _ in range(3)]
    assert statuses == [503, 503, 200]


async def test_slow_ms_delays_every_answer(client: httpx.AsyncClient, server: ServerInfo) -> None:
    await client.post(f"{server.url}/sim/faults", json={"slow_ms": 300})
    for path in ("/health", "/v1/models"):
        started = time.monotonic()
        assert (await client.get(server.url + path)).status_code == 200
        assert time.monotonic() - started >= 0.3
    started = time.monotonic()
    assert (await client.post(f"{server.url}/v1/chat/completions", json=CHAT)).status_code == 200
    assert time.monotonic() - started >= 0.3


async def test_refuse_connections_then_listen_again(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    answer = await client.post(f"{server.url}/sim/faults", json={"refuse_connections_ms": 1500})
    assert answer.status_code == 200
    # A fresh client: no pooled connection that would stay served.
    async with httpx.AsyncClient(timeout=5) as fresh:

        async def refused() -> bool:
            try:
                await fresh.get(f"{server.url}/health", headers={"connection": "close"})
            except httpx.ConnectError:
                return True
            return False

        await wait_until(refused, timeout_s=1.0)

        async def listening() -> bool:
            try:
                response = await fresh.get(f"{server.url}/health", headers={"connection": "close"})
            except httpx.ConnectError:
                return False
            return response.status_code == 200

        await wait_until(listening, timeout_s=5.0)


@pytest.mark.parametrize("value", [0, -1, "1", True])
async def test_refuse_connections_needs_a_positive_number(
    client: httpx.AsyncClient, server: ServerInfo, value: object
) -> None:
    answer = await client.post(f"{server.url}/sim/faults", json={"refuse_connections_ms": value})
    assert answer.status_code == 400


async def test_without_prefix_caching_a_repeated_prompt_hits_nothing(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    body = {"model": "sim-model", "prompt": list(range(100, 140)), "max_tokens": 1}
    for _ in range(2):
        answer = await client.post(f"{server.url}/v1/completions", json=body)
        assert answer.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    metrics = (await client.get(f"{server.url}/metrics")).text
    assert 'vllm:prefix_cache_hits_total{engine="0",model_name="sim-model"} 0.0' in metrics
