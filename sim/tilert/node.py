"""The simulated node's state and behaviour behind the HTTP API and the control plane.

State by lifetime: configuration, tokenizer, capabilities and faults for the process;
the receive slot for transfers; ``current`` for the one /pd/decode call holding the
node's lock. ``config.protocol`` picks TileRT 0.1.5's or 0.1.6's behaviour.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from sim.faults import FaultBoard
from sim.script import filler_ids
from sim.tilert.config import FAULTS, NodeConfig
from sim.tilert.decoder import DecodeFaults, DecodeJob, DecodeSession, Hold
from sim.tilert.records import DecodeRecord, NodeRecords
from sim.tilert.slot import Cancelled, ReceiveSlot, Transfer
from sim.tilert.validation import Refused, check_grammar, check_sampling, effective_sampling
from sim.tokenizers import Vocab

ENGINE_NAME = "SimEngine"


class DecodeRequest(BaseModel):
    """Body of ``POST /pd/decode`` (docs/protocols.md §1.4, §1.6); no range checks, as TileRT."""

    rid: str
    first_token_id: int
    max_tokens: int = 256
    sampling: dict[str, Any] | None = None
    timeout_s: float = 120.0
    stream: bool = False
    grammar_spec: dict[str, Any] | None = None  # 0.1.6
    enable_thinking: bool = True  # 0.1.6
    top_logprobs: int | None = None  # 0.1.6


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
        self.records = NodeRecords()
        self.slot = ReceiveSlot(
            config.sender_ranks,
            config.max_seq_len,
            config.request_timeout_s,
            protocol=config.protocol,
            on_corruption=self.records.corruption,
        )
        self.faults = FaultBoard(FAULTS)
        self.faults.arm(config.faults)
        self.capabilities = dict(config.capabilities)
        self.current: DecodeSession | None = None
        self._holds: list[Hold] = []  # decodes held at their start (`hold_start`)
        self.data_address: tuple[str, int] | None = None

    @property
    def v16(self) -> bool:
        """Whether this node behaves as TileRT 0.1.6."""
        return self.config.protocol == "0.1.6"

    def hello(self) -> dict[str, Any]:
        """The first control-plane message to every sender."""
        message: dict[str, Any] = {"magic": "tilert-pd"}
        if self.v16:
            message["protocol_version"] = 2
        message |= {
            "layout_version": self.config.layout_version,
            "transport": self.config.transport,
            "max_seq_len": self.config.max_seq_len,
            "busy": self.slot.advisory_busy,
        }
        if self.config.data_plane and self.data_address is not None:
            host, port = self.data_address
            message["sim_data_plane"] = {"host": host, "port": port}
        if self.v16:
            message["senders"] = len(self.config.sender_ranks)
        return message

    def capabilities_body(self) -> dict[str, Any]:
        """Body of ``GET /capabilities`` (0.1.6), plus our ``grammar`` key."""
        return {
            "profile": self.config.profile,
            "engine": ENGINE_NAME,
            "capabilities": dict(self.capabilities),
        }

    def status(self) -> dict[str, Any]:
        """Body of ``GET /decode_status``."""
        current = self.current
        return {"status": "busy" if current else "idle", "current_rid": current and current.rid}

    def cancel(self, rid: str) -> bool:
        """Cancel the decode of ``rid`` if it is in flight and cancellable.

        0.1.5 can cancel only once the engine started (not during the KV wait).
        """
        current = self.current
        if current is None or current.rid != rid or not current.cancellable:
            return False
        current.cancel()
        return True

    def reset(self) -> None:
        """Cancel whatever is in flight and forget transfers and records."""
        if self.current is not None:
            self.current.cancel()
        self._holds.clear()
        self.slot.reset()
        self.records.reset()

    def _release(self, session: DecodeSession) -> None:
        # Every decode end releases the receive slot: 0.1.5 erases whatever it holds,
        # 0.1.6 frees it only if it still holds this rid (and tombstones the rid).
        self.slot.release(session.rid)
        if self.current is session:
            self.current = None

    def begin(self, request: DecodeRequest, record: DecodeRecord) -> DecodeSession | Rejection:
        """Take the node's lock for a decode call, or reject it at once."""
        if self.current is not None:
            return Rejection(429, {"error": "busy", "current_rid": self.current.rid})
        session = DecodeSession(request.rid, self._release)
        session.cancellable = self.v16
        self.current = session
        if self.v16:
            self.slot.expect(request.rid)
        return session

    def _check(self, request: DecodeRequest) -> Refused | None:
        """0.1.6's checks before the KV wait, in its order."""
        try:
            if request.top_logprobs is not None and not self.capabilities.get("logprobs"):
                raise Refused(
                    501, "logprobs_unavailable", f"{ENGINE_NAME} does not produce logprobs"
                )
            check_sampling(request.sampling or {}, self.capabilities)
            check_grammar(request.grammar_spec, self.capabilities.get("grammar", False))
        except Refused as refused:
            return refused
        return None

    async def _drain(
        self, rid: str, timeout_s: float, cancelled: asyncio.Event | None
    ) -> Transfer | Cancelled | None:
        """Take completed transfers until ``rid``'s; others are stale and dropped."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            found = await self.slot.next_completed(deadline - loop.time(), cancelled)
            if not isinstance(found, Transfer) or found.rid == rid:
                return found
            self.records.stale_dropped.append(found.rid)
            self.slot.release(found.rid)  # 0.1.5: erases whatever the slot holds

    async def start(
        self, session: DecodeSession, request: DecodeRequest, record: DecodeRecord
    ) -> Rejection | None:
        """Check, wait for the rid's transfer, then start decoding; a rejection ends the call."""
        record.sampling = effective_sampling(self.config.protocol, request.sampling)
        # Only /sim/reset can end a 0.1.5 wait early (its /pd/cancel answers 404 then).
        cancelled = session.cancelled
        if self.v16:
            refused = self._check(request)
            if refused is not None:
                # The node drains its own rid's transfer (lock held) before it answers.
                await self._drain(request.rid, self.config.refusal_drain_s, cancelled)
                session.end_without_decode()
                record.error_type = refused.error_type
                return Rejection(refused.status, refused.body())
        found = await self._drain(request.rid, request.timeout_s, cancelled)
        if isinstance(found, Cancelled) and self.v16:
            session.end_without_decode()
            record.error_type = "request_cancelled"
            body = {
                "error": "cancelled during KV transfer",
                "error_type": "request_cancelled",
                "rid": request.rid,
            }
            return Rejection(499, body)
        if not isinstance(found, Transfer):
            session.end_without_decode()
            return Rejection(504, {"error": "kv_transfer_timeout", "rid": request.rid})
        if self.faults.take("decode_500", bool):  # preparing the engine failed: transfer gone
            session.end_without_decode()
            body = {"error": "engine prepare failed (sim fault)", "rid": request.rid}
            return Rejection(500, body)
        record.corrupted = found.overwritten_by is not None
        session.cancellable = True
        session.start(
            self._job(request, found, record.sampling),
            self.config.step_ms / 1000,
            self.config.tokens_per_step,
            self._faults(),
        )
        return None

    def _job(
        self, request: DecodeRequest, transfer: Transfer, sampling: dict[str, Any]
    ) -> DecodeJob:
        plan = self.slot.plan(request.rid)
        budget = max(request.max_tokens, 0)
        if plan is not None:
            continuation = plan[1:]
        else:
            # No data-plane state (a foreign connector): continue with filler, then EOS.
            length = max(self.config.default_output_tokens - 1, 0)
            continuation = [*filler_ids(self.vocab, request.rid, length), self.vocab.eos_ids[0]]
        eos_ids = self.vocab.eos_ids
        if sampling.get("ignore_eos"):
            eos_ids = ()
            continuation = [*continuation, *filler_ids(self.vocab, request.rid, budget)]
        return DecodeJob(
            rid=request.rid,
            first_token_id=request.first_token_id,
            max_tokens=request.max_tokens,
            continuation=continuation,
            eos_ids=eos_ids,
            prompt_seq_len=transfer.seq_len,
        )

    def release_held(self) -> int:
        """Let every decode held at its start (`hold_start`) go on; how many there were."""
        holds, self._holds = self._holds, []
        for hold in holds:
            hold.released.set()
        return len(holds)

    def held(self) -> int:
        """Decodes waiting at their hold now (`GET /sim/held`)."""
        return sum(hold.waiting for hold in self._holds)

    def _faults(self) -> DecodeFaults:
        slow = self.faults.take("slow_start_ms", float)
        hold = Hold() if self.faults.take("hold_start", bool) else None
        if hold is not None:
            self._holds.append(hold)
        return DecodeFaults(
            hold=hold,
            stall_after=self.faults.take("stall_after", int),
            die_after=self.faults.take("die_after", int),
            error_after=self.faults.take("error_after", int),
            slow_start_s=(slow or 0.0) / 1000,
        )
