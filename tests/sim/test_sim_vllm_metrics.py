"""The simulated vLLM server's /metrics, --max-num-seqs and prefix cache, over real sockets."""

import asyncio
import re
import time

import httpx
import pytest

from sim.stack import ServerInfo, SimStack
from tests.support.stacks import StackPool

from .sim_support import wait_until

pytestmark = pytest.mark.e2e

LABELS = '{engine="0",model_name="sim-model"}'
ARGS = ["--itl-ms", "20", "--prefill-ms-per-token", "20", "--max-num-seqs", "1"]


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=0,
        prefills=0,
        proxy=True,
        proxy_args=[*ARGS, "--block-size", "4", "--enable-prefix-caching"],
    )


@pytest.fixture
def server(stack: SimStack) -> ServerInfo:
    assert stack.proxy is not None
    return stack.proxy


async def _metrics(client: httpx.AsyncClient, server: ServerInfo) -> dict[str, float]:
    response = await client.get(f"{server.url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def _completion(prompt: list[int], max_tokens: int = 1, stream: bool = False) -> dict:
    return {"model": "sim-model", "prompt": prompt, "max_tokens": max_tokens, "stream": stream}


async def test_metrics_carry_vllm_names_types_and_labels(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    text = (await client.get(f"{server.url}/metrics")).text
    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert f"# TYPE vllm:{gauge} gauge" in text
        assert re.search(rf"^vllm:{gauge}{re.escape(LABELS)} \d", text, re.M)
    for counter in ("prefix_cache_queries", "prefix_cache_hits", "prompt_tokens"):
        assert f"# TYPE vllm:{counter}_total counter" in text
        assert f"# TYPE vllm:{counter}_created gauge" in text
        assert re.search(rf"^vllm:{counter}_total{re.escape(LABELS)} \d", text, re.M)
    assert re.search(
        r'^vllm:request_success_total\{engine="0",finished_reason="length",'
        r'model_name="sim-model"\} \d',
        text,
        re.M,
    )


async def test_running_and_waiting_follow_the_requests(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    before = await _metrics(client, server)

    async def stream(first: int) -> int:
        body = _completion([first, 7, 8], max_tokens=30, stream=True)
        async with client.stream("POST", f"{server.url}/v1/completions", json=body) as response:
            return len([line async for line in response.aiter_lines() if line.startswith("data")])

    tasks = [asyncio.create_task(stream(first)) for first in (5, 6)]

    async def one_running_one_waiting() -> bool:
        now = await _metrics(client, server)
        return (
            now[f"vllm:num_requests_running{LABELS}"] == 1
            and now[f"vllm:num_requests_waiting{LABELS}"] == 1
            and now[f"vllm:kv_cache_usage_perc{LABELS}"] > 0
        )

    await wait_until(one_running_one_waiting)
    assert await asyncio.gather(*tasks) == [31, 31]  # 30 tokens and [DONE] each
    after = await _metrics(client, server)
    assert after[f"vllm:num_requests_running{LABELS}"] == 0
    assert after[f"vllm:num_requests_waiting{LABELS}"] == 0
    assert after[f"vllm:kv_cache_usage_perc{LABELS}"] == 0
    key = f"vllm:generation_tokens_total{LABELS}"
    assert after[key] - before[key] == 60
    key = 'vllm:request_success_total{engine="0",finished_reason="length",model_name="sim-model"}'
    assert after[key] - before[key] == 2


async def test_a_repeated_prompt_hits_the_prefix_cache(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    prompt = list(range(1000, 1040))  # 40 tokens: 10 blocks of 4
    before = await _metrics(client, server)
    started = time.monotonic()
    first = (await client.post(f"{server.url}/v1/completions", json=_completion(prompt))).json()
    uncached_s = time.monotonic() - started
    started = time.monotonic()
    second = (await client.post(f"{server.url}/v1/completions", json=_completion(prompt))).json()
    cached_s = time.monotonic() - started
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    # The last block holds the last prompt token, which is always computed.
    assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": 36}
    assert uncached_s >= 40 * 0.020
    assert cached_s < uncached_s / 2  # 4 uncached tokens: 80 ms against 800 ms
    after = await _metrics(client, server)
    assert after[f"vllm:prefix_cache_queries_total{LABELS}"] == (
        before[f"vllm:prefix_cache_queries_total{LABELS}"] + 80
    )
    assert after[f"vllm:prefix_cache_hits_total{LABELS}"] == (
        before[f"vllm:prefix_cache_hits_total{LABELS}"] + 36
    )
    assert after[f"vllm:prompt_tokens_total{LABELS}"] == (
        before[f"vllm:prompt_tokens_total{LABELS}"] + 80
    )


async def test_a_shared_prefix_hits_up_to_where_prompts_differ(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    shared = list(range(2000, 2010))
    await client.post(f"{server.url}/v1/completions", json=_completion([*shared, 1, 2, 3]))
    answer = await client.post(f"{server.url}/v1/completions", json=_completion([*shared, 4, 5]))
    assert answer.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}


async def test_reset_empties_the_prefix_cache(
    client: httpx.AsyncClient, server: ServerInfo
) -> None:
    prompt = list(range(3000, 3009))
    await client.post(f"{server.url}/v1/completions", json=_completion(prompt))
    await client.post(f"{server.url}/sim/reset")
    answer = await client.post(f"{server.url}/v1/completions", json=_completion(prompt))
    assert answer.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
