"""What a vLLM simulator saw, for tests at ``GET /sim/requests``."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class RequestRecord:
    """One HTTP request to a generation endpoint."""

    path: str
    headers: dict[str, str]
    body: Any
    role: str
    engine_id: str
    received: float = field(default_factory=time.time)
    request_id: str | None = None
    engine_request_id: str | None = None
    rid: str | None = None
    kv_mode: str | None = None
    status: int | None = None
    first_output: float | None = None
    """When a stream's first output token went out: its prefill's end, as the client sees it."""
    finished: float | None = None


@dataclass(slots=True)
class TransferRecord:
    """One TileRT control-plane exchange for one rank."""

    rid: str
    rank: int
    host: str
    ctrl_port: int
    outcome: str | None = None
    start: float = field(default_factory=time.time)
    end: float | None = None
    protocol: str = "0.1.6"
    attempts: int = 0  # control connections opened (0.1.6 retries busy / cancelling)
    refusal: dict[str, Any] | None = None  # the node's last refusal frame, if any


@dataclass(slots=True)
class SideChannelRecord:
    """One NIXL side-channel read served by this instance."""

    remote_request_id: str
    outcome: str
    time: float = field(default_factory=time.time)


class ServerRecords:
    """Requests, transfers and side-channel reads, in arrival order."""

    def __init__(self) -> None:
        self.requests: list[RequestRecord] = []
        self.transfers: list[TransferRecord] = []
        self.side_channel: list[SideChannelRecord] = []

    def side_channel_event(self, key: str, outcome: str) -> None:
        """Note a side-channel read and how it went."""
        self.side_channel.append(SideChannelRecord(key, outcome))

    def reset(self) -> None:
        """Forget everything."""
        self.requests.clear()
        self.transfers.clear()
        self.side_channel.clear()

    def to_json(self) -> dict[str, Any]:
        """The body of ``GET /sim/requests``."""
        return {
            "requests": [asdict(r) for r in self.requests],
            "transfers": [asdict(t) for t in self.transfers],
            "side_channel": [asdict(s) for s in self.side_channel],
        }
