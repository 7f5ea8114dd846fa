"""Test clients that drive the simulators as their real peers do.

``transfer_*`` play the TileRT connector on a node's control plane and data plane;
``latency_request`` plays TileRT's own router (prefill with max_tokens 1 and
kv_transfer_params, read ``token_id:N``, stream /pd/decode).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from sim.framing import close_quietly, read_frame, write_frame
from sim.ids import reduce_rid
from sim.stack import NodeInfo, SimStack


def new_rid() -> str:
    """A dash-free request id, as a gateway must choose."""
    return uuid.uuid4().hex


async def wait_until(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    """Poll a real state until it holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


@dataclass
class OpenTransfer:
    """A control connection after the request was sent (no done yet).

    Against a 0.1.6 node (hello ``protocol_version`` 2) the node's answer to the request
    was read already (``admission``); against 0.1.5 nothing is read before done.
    """

    hello: dict[str, Any]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    rid: str
    rank: int
    admission: dict[str, Any] | None = None

    @property
    def v16(self) -> bool:
        return self.hello.get("protocol_version") == 2

    @property
    def refused(self) -> bool:
        return self.admission is not None and self.admission.get("accepted") is not True

    async def done(self) -> dict[str, Any] | None:
        """Send done; return the node's refusal, or None if it closed cleanly."""
        if self.refused:
            await close_quietly(self.writer)
            return self.admission
        done: dict[str, Any] = {"done": True, "rid": self.rid, "rank": self.rank}
        if self.admission is not None:
            done["generation"] = self.admission["generation"]
        try:
            await write_frame(self.writer, done)
        except ConnectionError:
            pass
        try:
            return await read_frame(self.reader)
        finally:
            await close_quietly(self.writer)

    async def drop(self) -> None:
        """Close the connection without done (a sender lost mid-transfer)."""
        await close_quietly(self.writer)

    async def answer(self) -> dict[str, Any] | None:
        """What the node says without sending done (a refusal, or None at close)."""
        if self.refused:
            await close_quietly(self.writer)
            return self.admission
        try:
            return await read_frame(self.reader)
        finally:
            await close_quietly(self.writer)


async def write_plan(hello: dict[str, Any], rid: str, rank: int, plan: list[int]) -> None:
    """Deliver a planned output on the node's simulated data plane (what RDMA writes)."""
    data = hello["sim_data_plane"]
    data_reader, data_writer = await asyncio.open_connection(data["host"], data["port"])
    await write_frame(data_writer, {"rid": rid, "rank": rank, "output_ids": plan})
    assert await read_frame(data_reader) == {"ok": True}
    await close_quietly(data_writer)


async def transfer_open(
    node: NodeInfo,
    rid: str,
    rank: int = 0,
    seq_len: int = 8,
    plan: list[int] | None = None,
    **extra: Any,
) -> OpenTransfer:
    """Hello, request (+ ``extra`` fields), the 0.1.6 answer, and (if given and not
    refused) the planned output on the data plane."""
    reader, writer = await asyncio.open_connection(node.host, node.ctrl_port)
    hello = await read_frame(reader)
    assert hello is not None
    request = {
        "rid": rid,
        "rank": rank,
        "seq_len": seq_len,
        "last_prompt_token": 7,
        "sampling": None,
        **extra,
    }
    await write_frame(writer, request)
    opened = OpenTransfer(hello, reader, writer, rid, rank)
    if opened.v16:
        opened.admission = await read_frame(reader)
    if plan is not None and not opened.refused:
        await write_plan(hello, rid, rank, plan)
    return opened


async def transfer(
    node: NodeInfo, rid: str, plan: list[int] | None = None, seq_len: int = 8
) -> None:
    """A complete, accepted single-rank transfer."""
    opened = await transfer_open(node, rid, plan=plan, seq_len=seq_len)
    assert await opened.done() is None


@dataclass
class DecodeResult:
    status: int
    lines: list[dict[str, Any]]

    @property
    def ids(self) -> list[int]:
        return [i for line in self.lines if "t" in line for i in line["t"]]

    @property
    def final(self) -> dict[str, Any]:
        return self.lines[-1]


async def decode_stream(
    client: httpx.AsyncClient, node: NodeInfo, rid: str, first: int, **body: Any
) -> DecodeResult:
    """POST /pd/decode with stream true and read every ndjson line."""
    payload = {"rid": rid, "first_token_id": first, "stream": True, **body}
    async with client.stream("POST", f"{node.url}/pd/decode", json=payload) as response:
        if response.status_code != 200:
            await response.aread()
            return DecodeResult(response.status_code, [response.json()])
        assert response.headers["content-type"] == "application/x-ndjson"
        lines = [orjson.loads(line) async for line in response.aiter_lines() if line]
        return DecodeResult(200, lines)


def first_token_id(body: dict[str, Any], endpoint: str) -> int:
    """The prefill's sampled token from ``token_id:N`` logprobs."""
    logprobs = body["choices"][0]["logprobs"]
    token = logprobs["content"][0]["token"] if endpoint == "chat" else logprobs["tokens"][0]
    assert token.startswith("token_id:"), token
    return int(token.split(":", 1)[1])


@dataclass
class LatencyResult:
    prefill: dict[str, Any]
    first: int
    rid: str
    decode: DecodeResult


async def latency_request(
    client: httpx.AsyncClient,
    prefill_url: str,
    node: NodeInfo,
    endpoint: str,
    payload: dict[str, Any],
    max_tokens: int = 256,
    request_id: str | None = None,
    timeout_s: float = 30.0,
) -> LatencyResult:
    """Prefill with kv_transfer_params, then stream the node's decode of the same rid."""
    body = {**payload, "max_tokens": 1, "stream": False}
    if endpoint == "chat":
        body |= {"logprobs": True, "top_logprobs": 1}
    else:
        body |= {"logprobs": 1}
    body["kv_transfer_params"] = {"tilert_host": node.host, "tilert_ctrl_port": node.ctrl_port}
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    headers = {"X-Request-Id": request_id or new_rid()}
    response = await client.post(prefill_url + path, json=body, headers=headers)
    assert response.status_code == 200, response.text
    prefill = response.json()
    first = first_token_id(prefill, endpoint)
    rid = reduce_rid(prefill["id"])
    decoded = await decode_stream(
        client, node, rid, first, max_tokens=max_tokens, timeout_s=timeout_s
    )
    return LatencyResult(prefill, first, rid, decoded)


async def reset_stack(client: httpx.AsyncClient, stack: SimStack) -> None:
    """Clear faults and records everywhere; leave every node idle."""
    servers = [*stack.prefills, *stack.decodes, *([stack.proxy] if stack.proxy else [])]
    for server in servers:
        await client.delete(f"{server.url}/sim/faults")
        await client.post(f"{server.url}/sim/reset")
    for node in stack.nodes:
        await client.delete(f"{node.url}/sim/faults")
        await client.post(f"{node.url}/sim/reset")

        async def idle(node: NodeInfo = node) -> bool:
            return (await client.get(f"{node.url}/decode_status")).json()["status"] == "idle"

        await wait_until(idle)


async def settled_transfers(
    client: httpx.AsyncClient, server_url: str, count: int
) -> list[dict[str, Any]]:
    """The prefill server's transfer records once ``count`` of them have an outcome."""

    async def settled() -> bool:
        records = (await client.get(f"{server_url}/sim/requests")).json()["transfers"]
        return sum(r["outcome"] is not None for r in records) >= count

    await wait_until(settled)
    return (await client.get(f"{server_url}/sim/requests")).json()["transfers"]
