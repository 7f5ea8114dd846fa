"""Equipment for the end-to-end tests of classification, spill and the throughput path.

Gateways run as real processes over a `SimStack`; clients are the OpenAI SDK (no retries,
so a 429 or 5xx reaches the test as sent), plain httpx only to hold nodes busy. Every wait
polls real state (the gateway's pool, the simulators' records) against a deadline.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from openai import AsyncOpenAI

from sim.stack import NodeInfo, SimStack
from tests.support.deployment import directive, simulator_urls
from tests.support.gateway import GatewayProcess

MODEL = "sim-model"
EXAMPLES = Path(__file__).resolve().parents[2] / "policies" / "examples"
ROUTE = "x-pd-route"
RULE = "x-pd-rule"
REROUTE = "x-pd-reroute-reason"


def closed_port() -> int:
    """A local TCP port nothing listens on (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def closed_node() -> dict[str, Any]:
    """A node entry for router.yaml whose control and HTTP ports are both closed."""
    return {"host": "127.0.0.1", "ctrl_port": closed_port(), "http_port": closed_port()}


def proxy_throughput(stack: SimStack) -> dict[str, Any]:
    assert stack.proxy is not None
    return {"mode": "proxy", "urls": [stack.proxy.url]}


def openai_client(gateway: GatewayProcess, http: httpx.AsyncClient) -> AsyncOpenAI:
    """The real SDK, pointed at the gateway; no retries so every status is seen as sent."""
    return AsyncOpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, http_client=http)


def say(text: str, **extra: Any) -> dict[str, Any]:
    """Chat arguments making the simulated model answer exactly `text`."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": directive(text)}],
        "max_tokens": 200,
        **extra,
    }


def words(count: int) -> str:
    """`count` short words: about one token each, so an output of known length."""
    return " ".join(f"w{i % 10}" for i in range(count))


class Sims:
    """Steers and reads the simulators of a stack, and a gateway's pool, over one client."""

    def __init__(self, stack: SimStack, http: httpx.AsyncClient) -> None:
        self.stack = stack
        self.http = http

    async def reset(self) -> None:
        """Clear faults and records on every simulator (`deployment.reset`, without blocking)."""
        for url in simulator_urls(self.stack):
            (await self.http.delete(url + "/sim/faults")).raise_for_status()
            (await self.http.post(url + "/sim/reset", json={})).raise_for_status()

    async def requests(self, url: str) -> list[dict[str, Any]]:
        """The generation requests a vLLM simulator received since its last reset."""
        response = await self.http.get(url + "/sim/requests")
        response.raise_for_status()
        return [r for r in response.json()["requests"] if r["path"].startswith("/v1/")]

    async def records(self, node: NodeInfo) -> dict[str, Any]:
        response = await self.http.get(node.url + "/sim/records")
        response.raise_for_status()
        return response.json()

    async def arm(self, url: str, faults: dict[str, Any]) -> None:
        (await self.http.post(url + "/sim/faults", json=faults)).raise_for_status()

    async def pool(self, gateway: GatewayProcess, model: str = MODEL) -> dict[str, Any]:
        """The gateway's own view of one model's TileRT pool (`/admin/pool`)."""
        return (await self._pools(gateway))["models"][model]

    async def wait_all_free(self, gateway: GatewayProcess, timeout_s: float = 15.0) -> None:
        """As `GatewayProcess.wait_all_free`, without blocking the test's event loop."""

        async def free() -> bool:
            state = await self._pools(gateway)
            held = [h for m in state["models"].values() for h in m["busy"].values() if h]
            return not held and state["background_tasks"] == 0

        await wait_until(free, what="every slot of the gateway to be free", timeout_s=timeout_s)

    async def _pools(self, gateway: GatewayProcess) -> dict[str, Any]:
        response = await self.http.get(gateway.url + "/admin/pool")
        response.raise_for_status()
        return response.json()


async def wait_until(
    probe: Callable[[], Awaitable[bool]], *, what: str, timeout_s: float = 10.0
) -> None:
    """Poll `probe` until it holds; fail naming `what` after the deadline."""
    deadline = time.monotonic() + timeout_s
    while not await probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.02)


@asynccontextmanager
async def observed(stack: SimStack, *gateways: GatewayProcess) -> AsyncIterator[Sims]:
    """One test's view of the deployment: clean simulators first; at the end every slot
    free in every gateway and no node ever running two decodes at once."""
    # Plain HTTP on loopback only: no TLS context to load for every test.
    async with httpx.AsyncClient(timeout=30, verify=False) as http:
        sims = Sims(stack, http)
        await sims.reset()
        yield sims
        for gateway in gateways:
            await sims.wait_all_free(gateway)
        for node in stack.nodes:
            records = await sims.records(node)
            assert records["max_overlap"] <= 1, "a node was double-booked"
            assert records["corruptions"] == [], "a node's receive buffer was overwritten"


@asynccontextmanager
async def held_nodes(
    gateway: GatewayProcess, sims: Sims, *, model: str = MODEL, count: int | None = None
) -> AsyncIterator[list[httpx.Response]]:
    """Every node of the stack (the first `count`) busy with a streamed decode that stalls
    after two tokens.

    Yields once each stream has delivered its first chunk (so each holds a slot); leaving
    closes the streams, as a client going away would, and the gateway frees the slots.
    """
    nodes = sims.stack.nodes[:count]
    for node in nodes:
        await sims.arm(node.url, {"stall_after": 2, "count": 1})
    body = {**say(words(50), stream=True), "model": model}
    streams: list[httpx.Response] = []
    readers = []  # kept referenced: a collected reader would close its stream
    try:
        for _ in nodes:
            request = sims.http.build_request(
                "POST", gateway.base_url + "/chat/completions", json=body
            )
            response = await sims.http.send(request, stream=True)
            streams.append(response)
            assert response.status_code == 200, await response.aread()
            assert response.headers[ROUTE] == "latency"
            readers.append(response.aiter_raw())
            assert (await anext(readers[-1])).startswith(b"data: ")
        state = await sims.pool(gateway, model)
        assert all(holder is not None for holder in state["busy"].values()), state
        yield streams
    finally:
        for response in streams:
            await response.aclose()
