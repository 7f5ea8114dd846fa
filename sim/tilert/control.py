"""The node's side of the control plane (docs/protocols.md §1.3, §1.5, §1.6), one
connection per sender rank.

0.1.5: hello → request → (refusal frame and close) or silence … → done → close.
0.1.6: the hello adds ``protocol_version`` and ``senders``; every request is answered
(``accepted`` true with a generation, or false with a reason); the done completes the
generation admitted on that connection, whatever rid it names.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeGuard

from sim.framing import FrameError, close_quietly, read_frame, write_frame
from sim.tilert.node import Node
from sim.tilert.slot import Admission, ControlRequest, Refusal, Transfer

_REQUEST_FIELDS: dict[str, type | tuple[type, ...]] = {
    "rid": str,
    "rank": int,
    "seq_len": int,
    "last_prompt_token": int,
}


def _valid_request(message: dict[str, Any]) -> TypeGuard[ControlRequest]:
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
        admitted: Transfer | None = None
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
            answer = self._admit(request)
            if isinstance(answer, Refusal):
                records.control_event(rid, rank, answer.outcome, seq_len)
                await write_frame(writer, answer.message)
                return
            admitted = answer.transfer
            records.control_event(rid, rank, "accepted", seq_len)
            if answer.message is not None:
                await write_frame(writer, answer.message)
            await self._await_done(reader, admitted, rid, rank)
        except FrameError:
            records.control_event(rid, rank, "protocol_error")
        except (ConnectionError, OSError):
            records.control_event(rid, rank, "connection_lost")
        finally:
            if admitted is not None and self._node.slot.v16:
                self._node.slot.writer_left(admitted)
            await close_quietly(writer)

    def _admit(self, request: ControlRequest) -> Admission | Refusal:
        slot = self._node.slot
        refusal = slot.seq_len_refusal(request["rid"], request["seq_len"])
        if refusal is not None:
            return refusal
        if self._node.faults.take("refuse_transfers", bool):
            current = slot.current
            return slot.busy_refusal(
                current.rid if current else "sim-fault", current.state if current else "free"
            )
        return slot.admit(request)

    async def _await_done(
        self, reader: asyncio.StreamReader, transfer: Transfer, rid: str, rank: int
    ) -> None:
        records = self._node.records
        try:
            done = await asyncio.wait_for(read_frame(reader), self._node.config.request_timeout_s)
        except TimeoutError:
            records.control_event(rid, rank, "done_timeout")
            return
        if done is None:
            records.control_event(rid, rank, "closed_without_done")
        elif done.get("done"):
            # Both versions complete the transfer admitted on this connection, for the
            # rank of its request, whatever rid (or generation) the done names.
            complete = self._node.slot.done(transfer, rank)
            records.control_event(rid, rank, "complete" if complete else "done")
        else:
            records.control_event(rid, rank, "protocol_error")
