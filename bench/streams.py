"""One streamed request each way it can be sent, timed chunk by chunk.

* direct orchestration of the latency path: the prefill with `max_tokens: 1` and
  `kv_transfer_params` under a dash-free X-Request-Id, its first token id, then the node's
  `/pd/decode` ndjson stream; no detokenization (the floor for any gateway);
* a streamed chat completion over SSE, to the gateway or straight to a vLLM server.

A chunk counts as received when the node line or SSE event carrying it is read; the
inter-chunk gaps are the times between consecutive chunks after the first. Every request
has an id (X-Request-Id, the node's rid when sent directly); `named` requests also carry
it as their `user`, which a gateway passes on to the prefill server, so that their chunks
can be paired with their node's record of when it wrote each line (`bench.batch_latency`).
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
    """One request: time to its first token and the gaps between its chunks, in seconds;
    its rid, the wall-clock time each chunk arrived, and from sending to the last chunk."""

    ttft_s: float
    gaps_s: list[float] = field(default_factory=list)
    rid: str = ""
    arrivals: list[float] = field(default_factory=list)
    tokens: int = 0
    duration_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.duration_s if self.duration_s > 0 else 0.0


class _Clock:
    """Chunk arrival times of one request."""

    def __init__(self, rid: str, tokens: int) -> None:
        self.started = time.perf_counter()
        self._last = 0.0
        self.sample = Sample(0.0, rid=rid, tokens=tokens)

    def chunk(self) -> None:
        now = time.perf_counter()
        self.sample.arrivals.append(time.time())
        if self._last:
            self.sample.gaps_s.append(now - self._last)
        else:
            self.sample.ttft_s = now - self.started
        self._last = now
        self.sample.duration_s = now - self.started


async def direct_latency(
    client: httpx.AsyncClient,
    prefill_url: str,
    node_url: str,
    node_address: tuple[str, int],
    model: str,
    script: Script,
    *,
    named: bool = False,
) -> Sample:
    """The latency flow by hand: prefill naming the node, then the node's ndjson ids."""
    rid = uuid.uuid4().hex
    clock = _Clock(rid, script.tokens)
    host, ctrl_port = node_address
    body = {
        "model": model,
        "messages": [{"role": "user", "content": script.prompt}],
        "max_tokens": 1,
        "logprobs": True,
        "top_logprobs": 1,
        "kv_transfer_params": {"tilert_host": host, "tilert_ctrl_port": ctrl_port},
    }
    if named:
        body["user"] = rid
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
    *,
    named: bool = False,
) -> Sample:
    """One streamed chat completion at `base_url` (ending in /v1); with `route`, the answer
    must say (`x-pd-route`) that the gateway served it on that path."""
    rid = uuid.uuid4().hex
    clock = _Clock(rid, script.tokens)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": script.prompt}],
        "max_tokens": script.tokens + 16,
        "stream": True,
    }
    if named:
        body["user"] = rid
    parts: list[str] = []
    headers = {"X-Request-Id": rid}
    url = base_url + "/chat/completions"
    async with client.stream("POST", url, json=body, headers=headers) as response:
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
