"""The simulated node's state and behaviour behind the HTTP API and the control plane.

State by lifetime: configuration, tokenizer and faults for the process; the receive slot
for transfers; ``current`` for the one /pd/decode call holding the node's lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from sim.faults import FaultBoard
from sim.script import filler_ids
from sim.tilert.config import FAULTS, NodeConfig
from sim.tilert.decoder import DecodeFaults, DecodeJob, DecodeSession
from sim.tilert.records import DecodeRecord, NodeRecords
from sim.tilert.slot import ReceiveSlot
from sim.tokenizers import Vocab


class DecodeRequest(BaseModel):
    """Body of ``POST /pd/decode`` (PROTOCOLS.md §1.4)."""

    rid: str
    first_token_id: int
    max_tokens: int = Field(default=256, ge=1)
    sampling: dict[str, Any] | None = None
    timeout_s: float = Field(default=120.0, ge=0)
    stream: bool = False


@dataclass(frozen=True, slots=True)
class Rejection:
    """A /pd/decode answer that is not a decode: status and JSON body."""

    status: int
    body: dict[str, Any]


class Node:
    """One simulated TileRT decode node."""

    def __init__(self, config: NodeConfig, vocab: Vocab) -> None:
        self.config = config
        self.vocab = vocab
        self.slot = ReceiveSlot(config.sender_ranks, config.max_seq_len, config.request_timeout_s)
        self.records = NodeRecords()
        self.faults = FaultBoard(FAULTS)
        self.faults.arm(config.faults)
        self.current: DecodeSession | None = None
        self.data_address: tuple[str, int] | None = None

    @property
    def busy(self) -> bool:
        """Decoding, or receiving a transfer (advisory, as in the hello)."""
        return self.current is not None or self.slot.receiving

    def hello(self) -> dict[str, Any]:
        """The first control-plane message to every sender."""
        message: dict[str, Any] = {
            "magic": "tilert-pd",
            "layout_version": self.config.layout_version,
            "transport": self.config.transport,
            "max_seq_len": self.config.max_seq_len,
            "busy": self.busy,
        }
        if self.config.data_plane and self.data_address is not None:
            host, port = self.data_address
            message["sim_data_plane"] = {"host": host, "port": port}
        return message

    def status(self) -> dict[str, Any]:
        """Body of ``GET /decode_status``."""
        current = self.current
        return {"status": "busy" if current else "idle", "current_rid": current and current.rid}

    def cancel(self, rid: str) -> bool:
        """Cancel the decode of ``rid`` if it is the one in flight."""
        current = self.current
        if current is None or current.rid != rid:
            return False
        current.cancel()
        return True

    def reset(self) -> None:
        """Cancel whatever is in flight and forget transfers and records."""
        if self.current is not None:
            self.current.cancel()
        self.slot.reset()
        self.records.reset()

    def _release(self, session: DecodeSession) -> None:
        if self.current is session:
            self.current = None

    def begin(self, request: DecodeRequest, record: DecodeRecord) -> DecodeSession | Rejection:
        """Take the node's lock for a decode call, or reject it at once."""
        if self.current is not None:
            return Rejection(429, {"error": "busy", "current_rid": self.current.rid})
        if self.faults.take("decode_500"):
            return Rejection(500, {"error": "engine prepare failed (sim fault)", "rid": record.rid})
        session = DecodeSession(request.rid, self._release)
        self.current = session
        return session

    async def start(self, session: DecodeSession, request: DecodeRequest) -> Rejection | None:
        """Wait for the rid's transfer, then start decoding; a rejection ends the call."""
        arrived = await self.slot.wait_complete(request.rid, request.timeout_s, session.cancelled)
        if not arrived and session.cancelled.is_set():
            # Cancelled before the transfer came: an empty decode that ends "cancelled".
            job = DecodeJob(request.rid, request.first_token_id, request.max_tokens, [], (), 0)
            session.start(job, 0.0, 1.0, DecodeFaults())
            return None
        if not arrived:
            session.end_without_decode()
            return Rejection(504, {"error": "kv_transfer_timeout", "rid": request.rid})
        self.records.stale_dropped.extend(self.slot.drop_stale(request.rid))
        transfer, plan = self.slot.take(request.rid)
        if plan is not None:
            continuation = plan[1:]
        else:
            # No data-plane state (a foreign connector): continue with filler, then EOS.
            length = max(self.config.default_output_tokens - 1, 0)
            continuation = [*filler_ids(self.vocab, request.rid, length), self.vocab.eos_ids[0]]
        job = DecodeJob(
            rid=request.rid,
            first_token_id=request.first_token_id,
            max_tokens=request.max_tokens,
            continuation=continuation,
            eos_ids=self.vocab.eos_ids,
            prompt_seq_len=transfer.seq_len,
        )
        session.start(job, self.config.step_ms / 1000, self.config.tokens_per_step, self._faults())
        return None

    def _faults(self) -> DecodeFaults:
        slow = self.faults.take("slow_start_ms")
        return DecodeFaults(
            stall_after=self.faults.take("stall_after"),
            die_after=self.faults.take("die_after"),
            error_after=self.faults.take("error_after"),
            slow_start_s=(slow or 0.0) / 1000,
        )

    @staticmethod
    def result_body(session: DecodeSession) -> dict[str, Any]:
        """The non-stream 200 body of a finished decode."""
        timing = {**session.timing_ms(), "finish_reason": session.finish_reason}
        return {
            "rid": session.rid,
            "token_ids": list(session.token_ids),
            "seq_len": session.seq_len + len(session.token_ids),
            "timing_ms": timing,
        }
