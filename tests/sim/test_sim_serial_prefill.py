"""--serial-prefill: a server's prefills take turns, as on a compute-bound GPU."""

import asyncio
import time

import httpx
import pytest

from sim.stack import SimStack
from tests.support.stacks import StackPool

pytestmark = pytest.mark.e2e

PREFILL_MS_PER_TOKEN = 20
PROMPT = list(range(10, 20))  # 10 tokens: 200 ms of prefill each
PREFILL_S = len(PROMPT) * PREFILL_MS_PER_TOKEN / 1000


def _args(*extra: str) -> list[str]:
    return ["--itl-ms", "0", "--prefill-ms-per-token", str(PREFILL_MS_PER_TOKEN), *extra]


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(nodes=0, prefills=0, proxy=True, proxy_args=_args("--serial-prefill"))


async def _complete(client: httpx.AsyncClient, url: str) -> float:
    body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 1}
    response = await client.post(f"{url}/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return time.perf_counter()


async def test_concurrent_prefills_wait_for_each_other(
    client: httpx.AsyncClient, stack: SimStack
) -> None:
    assert stack.proxy is not None
    started = time.perf_counter()
    finished = await asyncio.gather(*(_complete(client, stack.proxy.url) for _ in range(3)))
    # Three prefills in turn: the last one ends after all three prefill times (a lower bound,
    # which a slow machine cannot break); side by side, all three would end after one.
    assert max(finished) - started >= 3 * PREFILL_S


async def _first_token_s(client: httpx.AsyncClient, url: str, started: float) -> float:
    body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 2, "stream": True}
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        first = None
        async for line in response.aiter_lines():
            if first is None and line.startswith("data: "):
                first = time.perf_counter() - started
    assert first is not None, "no token streamed"
    return first


async def test_the_second_prefill_waits_for_the_first_one(
    client: httpx.AsyncClient, stack: SimStack
) -> None:
    assert stack.proxy is not None
    started = time.perf_counter()
    firsts = await asyncio.gather(
        *(_first_token_s(client, stack.proxy.url, started) for _ in range(2))
    )
    # The time to first token grows with the prefill work ahead: the later stream's first
    # token comes after both prefills (a lower bound); side by side it would after one.
    assert min(firsts) >= PREFILL_S
    assert max(firsts) >= 2 * PREFILL_S
