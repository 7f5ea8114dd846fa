"""How many TileRT nodes, prefill servers and native decode servers one model needs, from
what the gateway sees of its load and has measured of its servers (docs/operations.md,
"Sizing the pools").

* **TileRT nodes** (a queue of single-slot servers): the load offered to the pool, in
  Erlangs, is the time average of the slots held plus the requests waiting for one (every
  request either holds a node or waits for one; with no queue, Little's law makes the
  first the arrival rate times the mean hold). The nodes needed are the fewest with which
  Erlang's C formula, at the pool's mean hold time, has at most `tilert_wait_share` of the
  requests wait longer than `tilert_wait_ms` (`erlang.py`). The pool's state is shared, so
  every replica reads the whole pool and recommends the same.
* **Prefill servers**: the prefill work per second (the prompt tokens prefilled, times a
  server's measured time per token, plus the prefills, times its measured time for an empty
  prompt) is the servers it keeps busy; divided by `prefill_utilization`, the servers
  needed.
* **Native decode servers**: a decode server's gap between tokens grows with the requests
  it runs (the measured gap line); the most it may run is where that line reaches
  `decode_itl_ms`. The requests running, over that, are the servers needed.

The prefill and decode figures are this process's own traffic (the requests it sent): over
several replicas, their sum is the deployment's (the autoscaling objects add them up).
Every reading is constant work; the recommendations are computed when asked (a scrape).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from router.capacity.erlang import servers_needed
from router.capacity.smoothing import CounterRate, Level
from router.config import SizingConfig
from router.gate.base import GateSnapshot
from router.gate.hold_times import HoldTimeEstimator
from router.objectives.fits import Line
from router.objectives.timings import Timings
from router.telemetry.access import AccessRecord

Pool = Literal["tilert", "prefill", "decode"]

UNREADABLE = "gate_unavailable"
"""Why a pool's snapshot shows every node out when its shared state could not be read."""

READ_INTERVAL_S = 2.0
"""How often the gateway reads each model's load (its pool's state, its servers)."""


@dataclass(frozen=True, slots=True)
class PoolSize:
    """One pool's recommendation and what it rests on."""

    pool: Pool
    current: int
    """Members now: nodes in service, servers configured."""
    demand: float
    """Members the load needs, unrounded: the TileRT pool's offered load (Erlangs, before
    the queue's headroom); the prefill and decode servers needed at the targets."""
    recommended: int
    basis: Mapping[str, float] = field(default_factory=dict)
    """The figures behind it, for the admin API."""


class Sizer:
    """One model's load figures, followed over time, and its pools' recommended sizes."""

    def __init__(self, config: SizingConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        window_s = config.window_s
        self._busy = Level(window_s)
        self._waiting = Level(window_s)
        self._running = Level(window_s)
        self._token_rate = CounterRate(window_s)
        self._prefill_rate = CounterRate(window_s)
        self._tokens = 0
        self._prefills = 0
        self._nodes: int | None = None  # in service, at the last reading of the pool
        self._hold_s = HoldTimeEstimator.INITIAL_S
        self._prefill_urls: tuple[str, ...] = ()
        self._decode_urls: tuple[str, ...] = ()

    def adopt(self, old: Sizer) -> None:
        """A reload: the figures followed so far go on (the targets are the new ones)."""
        for name in ("_busy", "_waiting", "_running", "_token_rate", "_prefill_rate"):
            setattr(self, name, getattr(old, name))
        self._tokens, self._prefills = old._tokens, old._prefills
        self._nodes, self._hold_s = old._nodes, old._hold_s

    # -- readings ------------------------------------------------------------------------

    def answered(self, access: AccessRecord) -> None:
        """A request ended: the prefill it had done on a prefill server, if any (the tokens
        it computed, else its whole prompt)."""
        if access.prefill is None or access.prefill_ms is None:
            return
        tokens = access.prefill_tokens
        if tokens is None:
            tokens = access.prompt_tokens or 0
        self._tokens += max(0, tokens)
        self._prefills += 1

    def read_pool(self, snapshot: GateSnapshot) -> None:
        """The pool's state now; a snapshot taken while its shared state could not be read
        (every node out as `gate_unavailable`) is no reading: an outage is not an idle pool,
        and must not shrink the recommendation."""
        if snapshot.out and set(snapshot.out.values()) == {UNREADABLE}:
            return
        at = self._clock()
        busy = sum(1 for holder in snapshot.busy.values() if holder is not None)
        self._busy.read(busy, at)
        self._waiting.read(snapshot.waiting, at)
        self._nodes = snapshot.nodes - len(snapshot.out)
        if snapshot.hold_s is not None:
            self._hold_s = snapshot.hold_s

    def read_servers(
        self,
        *,
        prefill: Iterable[str],
        decode: Iterable[str],
        outstanding: Mapping[str, int],
    ) -> None:
        """The model's prefill and native decode servers, and this process's requests in
        flight on each."""
        at = self._clock()
        self._prefill_urls, self._decode_urls = tuple(prefill), tuple(decode)
        self._running.read(sum(outstanding.get(url, 0) for url in self._decode_urls), at)
        self._token_rate.read(self._tokens, at)
        self._prefill_rate.read(self._prefills, at)

    # -- recommendations -----------------------------------------------------------------

    def sizes(self, timings: Timings, *, tilert: bool) -> list[PoolSize]:
        """The model's pools (`tilert`: it has a TileRT pool), each with its recommendation
        (none for a pool not read yet)."""
        out = []
        if tilert and self._nodes is not None:
            out.append(self._tilert())
        if self._prefill_urls:
            out.append(self._prefill(timings))
        if self._decode_urls:
            out.append(self._decode(timings))
        return out

    def _tilert(self) -> PoolSize:
        config = self.config
        offered = self._busy.value + self._waiting.value
        needed = servers_needed(
            offered,
            hold_s=self._hold_s,
            wait_s=config.tilert_wait_ms / 1e3,
            share=config.tilert_wait_share,
        )
        basis = {
            "busy": self._busy.value,
            "waiting": self._waiting.value,
            "hold_s": self._hold_s,
            "arrivals_per_s": offered / self._hold_s,
        }
        return PoolSize("tilert", self._nodes or 0, offered, needed, _rounded(basis))

    def _prefill(self, timings: Timings) -> PoolSize:
        line = _mean_line(timings.prefill_line(url) for url in self._prefill_urls)
        tokens_per_s = self._token_rate.per_second
        prefills_per_s = self._prefill_rate.per_second
        busy = tokens_per_s * line.slope + prefills_per_s * line.intercept
        demand = busy / self.config.prefill_utilization
        basis = {
            "tokens_per_s": tokens_per_s,
            "prefills_per_s": prefills_per_s,
            "ms_per_token": line.slope * 1e3,
            "base_ms": line.intercept * 1e3,
            "busy": busy,
        }
        return PoolSize("prefill", len(self._prefill_urls), demand, _ceil(demand), _rounded(basis))

    def _decode(self, timings: Timings) -> PoolSize:
        line = _mean_line(timings.gap_line(url) for url in self._decode_urls)
        capacity = _running_within(line, self.config.decode_itl_ms / 1e3)
        running = self._running.value
        demand = running / capacity if math.isfinite(capacity) else min(1.0, running)
        basis = {
            "running": running,
            "running_per_server": capacity if math.isfinite(capacity) else -1.0,
            "gap_ms_one_running": line.at(1) * 1e3,
            "gap_ms_per_running": line.slope * 1e3,
        }
        return PoolSize("decode", len(self._decode_urls), demand, _ceil(demand), _rounded(basis))


def _running_within(line: Line, itl_s: float) -> float:
    """The most requests a decode server may run with its gap within `itl_s`: at least one
    (a server slower than that alone is still one request's server), infinite where the gap
    does not grow with them."""
    if line.at(1) >= itl_s:
        return 1.0
    if line.slope <= 0:
        return math.inf
    # A hair below a whole number (a float's error) is that number.
    return float(max(1, math.floor((itl_s - line.intercept) / line.slope + 1e-9)))


def _mean_line(lines: Iterable[Line]) -> Line:
    lines = list(lines)
    return Line(
        sum(line.intercept for line in lines) / len(lines),
        sum(line.slope for line in lines) / len(lines),
    )


def _ceil(demand: float) -> int:
    # A demand a hair above a whole number (a float's error) is that number.
    return max(0, math.ceil(demand - 1e-9))


def _rounded(basis: Mapping[str, float]) -> dict[str, float]:
    return {name: round(value, 4) for name, value in basis.items()}
