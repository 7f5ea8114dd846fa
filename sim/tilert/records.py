"""What a node saw, for tests at ``GET /sim/records``: decodes, control-plane requests,
corruptions of the receive buffer, and the largest number of /pd/decode calls ever in
flight at once (more than one means the node was double-booked)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class DecodeRecord:
    """One /pd/decode call, from arrival to the end of its response body."""

    rid: str
    start: float
    end: float | None = None
    last_write: float | None = None
    """A stream's end handed to the server: no reader can see it earlier. `end` is noted
    after the write, a moment later (or, if the node is preempted, later still)."""
    line_writes: list[float] = field(default_factory=list)
    """A stream's token lines, each when it was handed to the server (wall clock)."""
    status: int | None = None
    n: int = 0
    finish_reason: str | None = None
    stream: bool = False
    request: dict[str, Any] = field(default_factory=dict)  # the /pd/decode body as received
    error_type: str | None = None
    sampling: dict[str, Any] | None = None  # what the engine would have sampled with
    corrupted: bool = False  # the KV it decoded had been overwritten by another rid


@dataclass(slots=True)
class Corruption:
    """A write into the receive buffer while it held another rid's undecoded transfer."""

    rid: str  # the writer
    busy_rid: str  # the transfer overwritten
    kind: str  # write_while_busy | overwrote_complete
    at: float = field(default_factory=time.time)


@dataclass(slots=True)
class ControlRecord:
    """One control-plane event for a rid and rank."""

    rid: str | None
    rank: int | None
    outcome: str
    seq_len: int | None = None
    time: float = field(default_factory=time.time)


class NodeRecords:
    """Decode and control-plane history plus the overlap high-water mark."""

    def __init__(self) -> None:
        self.decodes: list[DecodeRecord] = []
        self.control: list[ControlRecord] = []
        self.stale_dropped: list[str] = []
        self.corruptions: list[Corruption] = []
        self.active_decodes = 0
        self.max_overlap = 0

    def decode_begin(
        self, rid: str, stream: bool, request: dict[str, Any] | None = None
    ) -> DecodeRecord:
        """Note a /pd/decode arrival; returns the record to finish later."""
        record = DecodeRecord(rid=rid, start=time.time(), stream=stream, request=request or {})
        self.decodes.append(record)
        self.active_decodes += 1
        self.max_overlap = max(self.max_overlap, self.active_decodes)
        return record

    def decode_end(self, record: DecodeRecord) -> None:
        """Note that a /pd/decode response body has ended."""
        record.end = time.time()
        self.active_decodes -= 1

    def control_event(
        self, rid: str | None, rank: int | None, outcome: str, seq_len: int | None = None
    ) -> None:
        """Note a control-plane request, refusal, done or protocol error."""
        self.control.append(ControlRecord(rid, rank, outcome, seq_len))

    def corruption(self, rid: str, busy_rid: str, kind: str) -> None:
        """Note a write that corrupted another rid's transfer."""
        self.corruptions.append(Corruption(rid, busy_rid, kind))

    def reset(self) -> None:
        """Forget history; the overlap mark restarts from what is in flight now."""
        self.decodes.clear()
        self.control.clear()
        self.stale_dropped.clear()
        self.corruptions.clear()
        self.max_overlap = self.active_decodes

    def to_json(self) -> dict[str, Any]:
        """The body of ``GET /sim/records``."""
        return {
            "decodes": [asdict(r) for r in self.decodes],
            "control": [asdict(r) for r in self.control],
            "stale_dropped": list(self.stale_dropped),
            "corruptions": [asdict(c) for c in self.corruptions],
            "active_decodes": self.active_decodes,
            "max_overlap": self.max_overlap,
        }
