"""The simulated data plane: where a sender deposits what RDMA would have written.

Each frame is ``{"rid", "rank", "output_ids"}`` (the planned output, first token first);
the node answers ``{"ok": true}`` and keeps the plan for the rid's decode. A write by a
rid the node refused ``busy`` lands in the single receive buffer all the same, and is
recorded as corruption of the transfer the slot holds.
"""

from __future__ import annotations

import asyncio

from sim.framing import FrameError, close_quietly, read_frame, write_frame
from sim.tilert.node import Node


class DataPlane:
    """Serves simulated data-plane connections for one node."""

    def __init__(self, node: Node) -> None:
        self._node = node

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (message := await read_frame(reader)) is not None:
                rid, ids = message.get("rid"), message.get("output_ids")
                if not isinstance(rid, str) or not isinstance(ids, list):
                    await write_frame(writer, {"error": "expected rid and output_ids"})
                    return
                self._node.slot.put_plan(rid, [int(i) for i in ids])
                await write_frame(writer, {"ok": True})
        except (FrameError, ConnectionError, OSError):
            pass
        finally:
            await close_quietly(writer)
