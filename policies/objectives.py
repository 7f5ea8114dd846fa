"""Objectives: what a rule may ask instead of a fixed path. The gateway predicts, for each
way it may serve a request, the time to its first token and the gap between its tokens, and
takes the cheapest way whose prediction meets the objective.

    - name: chat
      match: {headers: {x-workload: chat}}
      objective: {ttft_ms: 1500, itl_ms: 40}
      ways: [whole, split, tilert]          # allowed, cheapest first (the default)
      on_miss: best                         # best, queue or reject
      allow_client_objective: {ttft_ms: 300, itl_ms: 15}

A client may tighten its rule's objective with `x-pd-objective-ttft-ms` and
`x-pd-objective-itl-ms`, down to the rule's `allow_client_objective` floor, never loosen it;
nothing a client sends adds a way its rule does not list.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from policies.errors import PolicyError

Way = Literal["whole", "split", "tilert"]
"""How a request is served: `whole` on one vLLM server of the native path (prefill and
decode there), `split` into a prefill and a decode leg on the native path, or `tilert` on a
TileRT node (the latency path). In `proxy` mode the proxy chooses between whole and split,
so both name one way there."""

WAYS: tuple[Way, ...] = ("whole", "split", "tilert")
"""Every way, in the default order of cost: cheapest first."""

OnMiss = Literal["best", "queue", "reject"]
"""When no way is predicted to meet the objective: take the way with the smallest predicted
miss (`best`); wait for a TileRT node as a fixed `latency` rule would (`queue`); or answer 429
with Retry-After at once (`reject`). A request waiting for a node leaves the queue at its
deadline under `best` (for the best native way) and `reject` (a 429), not under `queue`."""

TTFT_HEADER = "x-pd-objective-ttft-ms"
ITL_HEADER = "x-pd-objective-itl-ms"
MAX_OBJECTIVE_MS = 3_600_000
"""An hour: the largest objective a rule or a client may state."""


class ClientObjectiveError(PolicyError, ValueError):
    """A client's objective header is not a whole number of milliseconds in range."""

    def __init__(self, header: str, message: str) -> None:
        super().__init__(message)
        self.header = header


@dataclass(frozen=True, slots=True)
class Objective:
    """Time to first token and mean gap between tokens, in milliseconds; None: no bound."""

    ttft_ms: int | None = None
    itl_ms: int | None = None

    def tightened(self, headers: Mapping[str, str], floor: Objective | None) -> Objective:
        """This objective with what the client asked in its headers, where the rule allows
        it (`floor`: the tightest a client may ask): a client only tightens a bound this
        objective sets, never loosens it or adds one; below the floor it gets the floor."""
        if floor is None:
            return self
        return Objective(
            _tighter(self.ttft_ms, headers.get(TTFT_HEADER), floor.ttft_ms, TTFT_HEADER),
            _tighter(self.itl_ms, headers.get(ITL_HEADER), floor.itl_ms, ITL_HEADER),
        )

    def describe(self) -> str:
        parts = []
        if self.ttft_ms is not None:
            parts.append(f"ttft_ms={self.ttft_ms}")
        if self.itl_ms is not None:
            parts.append(f"itl_ms={self.itl_ms}")
        return "; ".join(parts)


def _tighter(bound: int | None, asked: str | None, floor: int | None, header: str) -> int | None:
    if asked is None or bound is None or floor is None:
        return bound
    value = asked.strip()
    # ASCII digits only: `isdigit` alone takes superscripts, which `int` refuses.
    digits = value.isascii() and value.isdigit() and len(value) <= 10
    if not digits or not 0 < int(value) <= MAX_OBJECTIVE_MS:
        raise ClientObjectiveError(
            header,
            f"{header} must be a whole number of milliseconds from 1 to {MAX_OBJECTIVE_MS},"
            f" not {value[:40]!r}",
        )
    return min(bound, max(floor, int(value)))


@dataclass(frozen=True, slots=True)
class ObjectiveAction:
    """A rule's objective and how it is served (see the module's docstring)."""

    objective: Objective
    ways: tuple[Way, ...] = WAYS
    on_miss: OnMiss = "best"
    client_floor: Objective | None = None
    """The tightest objective a client may ask with its headers; None: clients may not."""
