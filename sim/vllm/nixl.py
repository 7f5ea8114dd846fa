"""NIXL disaggregation (docs/protocols.md §2.2, §2.3): producer state and the side channel.

The prefill side keeps each ``do_remote_decode`` request's state (planned output ids and
prompt length) under its request id until a decode instance reads it or it expires. A
decode instance reads it over the prefill's side channel (framed JSON): at once in pull
mode; in push mode it registers and waits, because the prefill leg may come later.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sim.faults import FaultBoard
from sim.framing import FrameError, close_quietly, read_frame, write_frame

BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class KvState:
    """What a decode instance needs to continue a prefilled request."""

    output_ids: list[int]
    prompt_len: int


class KvStore:
    """Producer-side states by remote request id, each read at most once."""

    def __init__(self, expiry_s: float) -> None:
        self._expiry_s = expiry_s
        self._states: dict[str, tuple[float, KvState]] = {}
        self._arrivals: dict[str, asyncio.Event] = {}

    def put(self, key: str, state: KvState) -> None:
        """Keep ``state`` for ``key`` until read or expired."""
        now = time.monotonic()
        self._states = {k: v for k, v in self._states.items() if v[0] > now}
        self._states[key] = (now + self._expiry_s, state)
        arrival = self._arrivals.get(key)
        if arrival is not None:
            arrival.set()

    def _pop(self, key: str) -> KvState | None:
        entry = self._states.pop(key, None)
        if entry is None or entry[0] <= time.monotonic():
            return None
        return entry[1]

    async def take(self, key: str, wait_s: float) -> KvState | None:
        """Read and forget ``key``'s state, waiting up to ``wait_s`` for it to appear."""
        if key in self._states or wait_s <= 0:
            return self._pop(key)
        arrival = self._arrivals.setdefault(key, asyncio.Event())
        try:
            await asyncio.wait_for(arrival.wait(), wait_s)
        except TimeoutError:
            return None
        finally:
            self._arrivals.pop(key, None)
        return self._pop(key)


def producer_params(
    engine_id: str,
    host: str,
    side_channel_port: int,
    key: str,
    prompt_len: int,
    cached_tokens: int = 0,
) -> dict[str, Any]:
    """The ``kv_transfer_params`` a prefill response carries for the decode leg: vLLM 0.32's
    NixlConnector's keys in its order (checked against it by the real-vLLM tier,
    tests/real_vllm/test_native_nixl.py), the block ids one list per KV cache group (one
    here). vLLM's ``remote_request_id`` is its internal id (``chatcmpl-<X-Request-Id>-<8
    hex>``); this one is the key the side channel keeps the state under."""
    blocks = -(-prompt_len // BLOCK_SIZE)
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [list(range(1, blocks + 1))],
        "remote_engine_id": engine_id,
        "remote_request_id": key,
        "remote_host": host,
        "remote_port": side_channel_port,
        "tp_size": 1,
        "dcp_size": 1,
        "pp_size": 1,
        "remote_num_tokens": prompt_len,
        "remote_blocks_expiry_time": None,
        "transfer_mode": "pull",
        "remote_prefill_cached_tokens": cached_tokens,
    }


class SideChannel:
    """Serves reads of producer state: ``{"op": "read", "remote_request_id", "engine_id",
    "wait_s"}`` → ``{"ok": true, "output_ids", "prompt_len"}`` or ``{"error"}``."""

    def __init__(
        self, engine_id: str, store: KvStore, faults: FaultBoard, log: Callable[[str, str], None]
    ) -> None:
        self._engine_id = engine_id
        self._store = store
        self._faults = faults
        self._log = log

    async def _answer(self, message: dict[str, Any]) -> dict[str, Any]:
        key = str(message.get("remote_request_id"))
        if message.get("op") != "read":
            return {"error": "unknown op"}
        if message.get("engine_id") not in (None, self._engine_id):
            return {"error": f"engine id mismatch: this is {self._engine_id}"}
        if self._faults.take("pull_fail", bool):
            self._log(key, "failed_fault")
            return {"error": "sim fault: side channel read failed"}
        state = await self._store.take(key, float(message.get("wait_s") or 0))
        if state is None:
            self._log(key, "not_found")
            return {"error": f"no KV state for {key}"}
        self._log(key, "read")
        return {"ok": True, "output_ids": state.output_ids, "prompt_len": state.prompt_len}

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (message := await read_frame(reader)) is not None:
                await write_frame(writer, await self._answer(message))
        except (FrameError, ConnectionError, OSError):
            pass
        finally:
            await close_quietly(writer)


class PullError(Exception):
    """Reading the remote prefill's KV state failed."""


async def read_remote(
    host: str, port: int, key: str, engine_id: str | None, wait_s: float
) -> KvState:
    """Read ``key``'s state from a prefill instance's side channel."""
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        raise PullError(f"cannot reach side channel {host}:{port}: {exc}") from exc
    try:
        request = {"op": "read", "remote_request_id": key, "engine_id": engine_id, "wait_s": wait_s}
        await write_frame(writer, request)
        answer = await read_frame(reader)
    except (FrameError, ConnectionError, OSError) as exc:
        raise PullError(f"side channel {host}:{port} failed: {exc}") from exc
    finally:
        await close_quietly(writer)
    if answer is None or not answer.get("ok"):
        raise PullError((answer or {}).get("error", "side channel closed"))
    return KvState([int(i) for i in answer["output_ids"]], int(answer["prompt_len"]))
