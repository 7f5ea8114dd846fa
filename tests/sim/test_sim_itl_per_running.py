"""--itl-ms-per-running: the time per output token grows with the requests running, as a
vLLM engine step takes longer the larger its batch."""

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from sim.stack import ServerInfo, SimStack
from sim.vllm.config import parse_config
from tests.support.stacks import StackPool

from .sim_support import wait_until

ITL_MS = 2
ITL_MS_PER_RUNNING = 40
TOKENS = 20
# A gap alone is 2 ms, beside one other request 42 ms: the threshold sits far from both.
THRESHOLD_S = 0.015
SCRIPTED = "[[sim-output]]" + "word " * 200 + "[[/sim-output]]"
MESSAGES = [{"role": "user", "content": SCRIPTED}]

# The measured request per endpoint and mode (max_tokens cuts every one at TOKENS tokens).
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "completions": ("/v1/completions", {"prompt": SCRIPTED, "max_tokens": TOKENS}),
    "completions-stream": (
        "/v1/completions",
        {"prompt": SCRIPTED, "max_tokens": TOKENS, "stream": True},
    ),
    "chat": ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": TOKENS}),
    "chat-stream": (
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": TOKENS, "stream": True},
    ),
    "responses-stream": (
        "/v1/responses",
        {"input": SCRIPTED, "max_output_tokens": TOKENS, "stream": True},
    ),
}


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=0,
        prefills=0,
        proxy=True,
        proxy_args=[
            "--itl-ms",
            str(ITL_MS),
            "--itl-ms-per-running",
            str(ITL_MS_PER_RUNNING),
            "--prefill-ms-per-token",
            "0",
        ],
    )


@pytest.fixture
def server(stack: SimStack) -> ServerInfo:
    assert stack.proxy is not None
    return stack.proxy


def test_the_option_defaults_to_a_gap_that_ignores_the_load() -> None:
    assert parse_config([]).itl_ms_per_running == 0.0
    assert parse_config(["--itl-ms-per-running", "2.5"]).itl_ms_per_running == 2.5


async def _mean_gap_s(client: httpx.AsyncClient, server: ServerInfo, name: str) -> float:
    """The request's time over its gaps between tokens (no prefill time: 0 ms a token)."""
    path, body = REQUESTS[name]
    started = time.perf_counter()
    async with client.stream(
        "POST", server.url + path, json={"model": "sim-model", **body}
    ) as response:
        assert response.status_code == 200
        await response.aread()
    return (time.perf_counter() - started) / (TOKENS - 1)


@asynccontextmanager
async def _another_request(client: httpx.AsyncClient, server: ServerInfo) -> AsyncIterator[None]:
    """A longer stream, running (its first token out) from entry until after the exit."""
    body = {"model": "sim-model", "prompt": SCRIPTED, "max_tokens": 3 * TOKENS, "stream": True}
    async with client.stream("POST", f"{server.url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        lines = response.aiter_lines()
        async for line in lines:
            if line.startswith("data: "):
                break
        yield
        async for _ in lines:
            pass


async def _running(client: httpx.AsyncClient, server: ServerInfo) -> float:
    for line in (await client.get(f"{server.url}/metrics")).text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no vllm:num_requests_running")


@pytest.mark.e2e
@pytest.mark.serial
@pytest.mark.parametrize("name", list(REQUESTS))
async def test_the_gap_between_tokens_grows_with_the_requests_running(
    client: httpx.AsyncClient, server: ServerInfo, name: str
) -> None:
    alone = await _mean_gap_s(client, server, name)
    async with _another_request(client, server):
        assert await _running(client, server) == 1
        beside = await _mean_gap_s(client, server, name)

    async def idle() -> bool:
        return await _running(client, server) == 0

    await wait_until(idle)
    assert alone < THRESHOLD_S, f"{alone * 1000:.1f} ms a gap alone"
    assert beside >= THRESHOLD_S, f"{beside * 1000:.1f} ms a gap beside another request"
