"""One streamed request each way it can be sent, timed chunk by chunk.

* direct orchestration of the latency path: the prefill with `max_tokens: 1` and
  `kv_transfer_params` under a dash-free X-Request-Id, its first token id, then the node's
  `/pd/decode` ndjson stream; no detokenization (the floor for any gateway);
* a streamed chat completion over SSE, to the gateway or straight to a vLLM server.

A chunk counts as received when the node line or SSE event carrying it is read; the
inter-chunk gaps are the times between consecutive chunks after the first.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import httpx
import orjson

from bench.script import Script


class BenchFailure(RuntimeError):
    """A request was answered wrongly: the figures would not mean anything."""


@dataclass(slots=True)
class Sample:
    """One request: time to its first token and the gaps between its chunks, in seconds."""

    ttft_s: float
    gaps_s: list[float] = field(default_factory=list)


class _Clock:
    """Chunk arrival times of one request."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self._last = 0.0
        self.sample = Sample(0.0)

    def chunk(self) -> None:
        now = time.perf_counter()
        if self._last:
            self.sample.gaps_s.append(now - self._last)
        else:
            self.sample.ttft_s = now - self.started
        self._last = now


async def direct_latency(
    client: httpx.AsyncClient,
    prefill_url: str,
    node_url: str,
    node_address: tuple[str, int],
    model: str,
    script: Script,
) -> Sample:
    """The latency flow by hand: prefill naming the node, then the node's ndjson ids."""
    clock = _Clock()
    rid = uuid.uuid4().hex
    host, ctrl_port = node_address
    body = {
        "model": model,
        "messages": [{"role": "user", "content": script.prompt}],
        "max_tokens": 1,
        "logprobs": True,
        "top_logprobs": 1,
        "kv_transfer_params": {"tilert_host": host, "tilert_ctrl_port": ctrl_port},
    }
    prefill = await client.post(
        prefill_url + "/v1/chat/completions", json=body, headers={"X-Request-Id": rid}
    )
    prefill.raise_for_status()
    token = prefill.json()["choices"][0]["logprobs"]["content"][0]["token"]
    decode = {
        "rid": rid,
        "first_token_id": int(token.removeprefix("token_id:")),
        "max_tokens": script.tokens + 16,
        "stream": True,
    }
    count = 0
    async with client.stream("POST", node_url + "/pd/decode", json=decode) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            event = orjson.loads(line)
            if "t" in event:
                clock.chunk()
                count += len(event["t"])
            elif "error" in event:
                raise BenchFailure(f"direct: the node failed: {event}")
    if count != script.tokens:
        raise BenchFailure(f"direct: {count} tokens received, {script.tokens} scripted")
    return clock.sample


async def chat_stream(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    script: Script,
    route: str | None = None,
) -> Sample:
    """One streamed chat completion at `base_url` (ending in /v1); with `route`, the answer
    must say (`x-pd-route`) that the gateway served it on that path."""
    clock = _Clock()
    body = {
        "model": model,
        "messages": [{"role": "user", "content": script.prompt}],
        "max_tokens": script.tokens + 16,
        "stream": True,
    }
    parts: list[str] = []
    async with client.stream("POST", base_url + "/chat/completions", json=body) as response:
        response.raise_for_status()
        if route is not None and response.headers.get("x-pd-route") != route:
            served = response.headers.get("x-pd-route")
            raise BenchFailure(f"{base_url}: served on {served!r}, not {route!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = orjson.loads(line[6:])
            if event["choices"]:
                content = event["choices"][0]["delta"].get("content")
                if content:
                    clock.chunk()
                    parts.append(content)
    if "".join(parts) != script.text:
        raise BenchFailure(f"{base_url}: the streamed text differs from the script")
    return clock.sample
