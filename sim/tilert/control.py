"""The node's side of the control plane (PROTOCOLS.md §1.3), one connection per sender rank.

hello → request → (refusal and close) or … → done. The node closes the connection after
the done, so a sender can tell acceptance (end of stream) from refusal (an error frame).
"""

from __future__ import annotations

import asyncio
from typing import Any

from sim.framing import FrameError, close_quietly, read_frame, write_frame
from sim.tilert.node import Node
from sim.tilert.slot import Refusal

_REQUEST_FIELDS: dict[str, type | tuple[type, ...]] = {
    "rid": str,
    "rank": int,
    "seq_len": int,
    "last_prompt_token": int,
}


def _valid_request(message: dict[str, Any]) -> bool:
    fields_ok = all(isinstance(message.get(k), t) for k, t in _REQUEST_FIELDS.items())
    sampling = message.get("sampling")
    return fields_ok and (sampling is None or isinstance(sampling, dict))


class ControlPlane:
    """Serves control-plane connections for one node."""

    def __init__(self, node: Node) -> None:
        self._node = node

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        records = self._node.records
        rid: str | None = None
        rank: int | None = None
        try:
            await write_frame(writer, self._node.hello())
            request = await read_frame(reader)
            if request is None:
                records.control_event(None, None, "closed_before_request")
                return
            if not _valid_request(request):
                records.control_event(None, None, "protocol_error")
                return
            rid, rank, seq_len = request["rid"], request["rank"], request["seq_len"]
            refusal = self._admit(request)
            if refusal is not None:
                records.control_event(rid, rank, refusal.outcome, seq_len)
                await write_frame(writer, refusal.message)
                return
            records.control_event(rid, rank, "accepted", seq_len)
            await self._await_done(reader, rid, rank)
        except FrameError:
            records.control_event(rid, rank, "protocol_error")
        except (ConnectionError, OSError):
            records.control_event(rid, rank, "connection_lost")
        finally:
            await close_quietly(writer)

    def _admit(self, request: dict[str, Any]) -> Refusal | None:
        slot = self._node.slot
        if self._node.faults.take("refuse_transfers"):
            busy_rid = slot.in_progress.rid if slot.in_progress else "sim-fault"
            return Refusal({"error": "busy", "busy_rid": busy_rid}, "refused_busy")
        return slot.open(
            request["rid"],
            request["rank"],
            request["seq_len"],
            request["last_prompt_token"],
            request.get("sampling"),
        )

    async def _await_done(self, reader: asyncio.StreamReader, rid: str, rank: int) -> None:
        records = self._node.records
        try:
            done = await asyncio.wait_for(read_frame(reader), self._node.config.request_timeout_s)
        except TimeoutError:
            records.control_event(rid, rank, "done_timeout")
            return
        if done is None:
            records.control_event(rid, rank, "closed_without_done")
        elif done.get("done") is True and done.get("rid") == rid:
            done_rank = done.get("rank", rank)
            complete = self._node.slot.done(rid, done_rank if isinstance(done_rank, int) else rank)
            records.control_event(rid, rank, "complete" if complete else "done")
        else:
            records.control_event(rid, rank, "protocol_error")
