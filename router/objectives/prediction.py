"""For each way a request may take, its predicted time to first token and gap between
tokens; and the choice among them: the cheapest way predicted to meet the objective, else
what the rule's `on_miss` says. Pure: the facts come in (`WayFacts`, gathered from the live
servers by `ObjectivePath`, or assumed by `pd-gateway classify`), the plan goes out.

Time to first token, by way:
* `whole`: the decode server's own time to first token for the prompt tokens it does not
  hold (learned from its whole answers);
* `split`: the prefill server's prefill of the tokens it does not hold, then the hand-off
  (KV transfer and first decode step, learned per way);
* `tilert`: the wait for a node (the queue ahead and how long nodes are held), the prefill,
  then the hand-off.
The gap: a vLLM decode server's at the requests it will be running with this one; a TileRT
node's (one request at a time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from policies import Objective, OnMiss, Way
from router.objectives.timings import Timings
from router.selection import Choice


@dataclass(frozen=True, slots=True)
class WayFacts:
    """What is known, for one request, of one way to serve it."""

    way: Way
    uncached: int
    """Prompt tokens the way's prefill has to compute: the prompt less what the server that
    prefills it (the decode server for `whole`) is expected to hold."""
    decode: Choice | None = None
    """Where the answer comes from: the decode server (whole, split) or the proxy; None for
    a node."""
    prefill: Choice | None = None
    """The prefill server (split, tilert)."""
    running: int = 1
    """Requests the decode server will be running, this one included."""
    wait_s: float = 0.0
    """`tilert`: the expected wait for a node."""
    label: str | None = None
    """What the way is called where it differs (`proxy`: the proxy's whole-or-split)."""

    @property
    def server(self) -> str | None:
        return self.decode.url if self.decode is not None else None


@dataclass(frozen=True, slots=True)
class Prediction:
    facts: WayFacts
    ttft_s: float
    itl_s: float
    parts: tuple[tuple[str, float], ...]
    """The time to first token's parts, in seconds (`wait`, `prefill`, `handoff`, `ttft`)."""

    @property
    def way(self) -> Way:
        return self.facts.way

    @property
    def name(self) -> str:
        return self.facts.label or self.facts.way

    def shortfall(self, objective: Objective) -> float:
        """How far over the objective, as the larger ratio of predicted to wanted (1 or
        less: it meets it)."""
        ratios = [0.0]
        if objective.ttft_ms is not None:
            ratios.append(self.ttft_s * 1e3 / objective.ttft_ms)
        if objective.itl_ms is not None:
            ratios.append(self.itl_s * 1e3 / objective.itl_ms)
        return max(ratios)

    def meets(self, objective: Objective, margin: float = 0.0) -> bool:
        """Within every bound set, `margin` (a share) to spare, and with a first token at
        all (a pool with no node in service has none to give)."""
        return math.isfinite(self.ttft_s) and self.shortfall(objective) * (1 + margin) <= 1.0

    def node_deadline_s(self, objective: Objective) -> float | None:
        """`tilert`: by when (seconds from now) a node must be had for the first token to
        come in time; None without a first-token objective."""
        if objective.ttft_ms is None:
            return None
        after_grant = sum(seconds for name, seconds in self.parts if name != "wait")
        return max(0.0, objective.ttft_ms / 1e3 - after_grant)

    def describe(self) -> str:
        parts = ""
        if len(self.parts) > 1:
            listed = ", ".join(f"{name} {seconds * 1e3:.1f}" for name, seconds in self.parts)
            parts = f" ({listed})"
        where = f" on {self.facts.server}" if self.facts.server else ""
        return (
            f"{self.name}{where}: ttft {self.ttft_s * 1e3:.1f} ms{parts},"
            f" itl {self.itl_s * 1e3:.2f} ms, {self.facts.uncached} uncached tokens"
        )


def predict(facts: WayFacts, timings: Timings) -> Prediction:
    if facts.way == "whole":
        assert facts.decode is not None
        server = facts.decode.url
        ttft = timings.whole_ttft_s(server, facts.uncached)
        parts: tuple[tuple[str, float], ...] = (("ttft", ttft),)
        return Prediction(facts, ttft, timings.gap_s(server, facts.running), parts)
    assert facts.prefill is not None
    prefill = timings.prefill_s(facts.prefill.url, facts.uncached)
    handoff = timings.handoff_s(facts.way)
    if facts.way == "split":
        assert facts.decode is not None
        parts = (("prefill", prefill), ("handoff", handoff))
        itl = timings.gap_s(facts.decode.url, facts.running)
        return Prediction(facts, prefill + handoff, itl, parts)
    parts = (("wait", facts.wait_s), ("prefill", prefill), ("handoff", handoff))
    ttft = facts.wait_s + prefill + handoff
    return Prediction(facts, ttft, timings.node_gap_s(), parts)


Reason = Literal["meets", "least_miss", "queue", "none_meets"]
"""Why a plan took its way: `meets` (the cheapest predicted to meet the objective),
`least_miss` (none does; the smallest predicted miss), `queue` (none does; a node, waited
for), `none_meets` (none does; refused)."""


@dataclass(frozen=True, slots=True)
class Plan:
    objective: Objective
    predictions: tuple[Prediction, ...]
    """Each way's, cheapest first."""
    chosen: Prediction | None
    """None: refused (`on_miss: reject` and no way meets the objective)."""
    reason: Reason
    margin: float = 0.0
    """The share a prediction had to spare to meet the objective."""

    @property
    def meets(self) -> bool:
        return self.chosen is not None and self.chosen.meets(self.objective, self.margin)

    def header(self) -> str:
        """`x-pd-way`: the way, its prediction, and why."""
        if self.chosen is None:
            return f"none; reason={self.reason}"
        chosen = self.chosen
        return (
            f"{chosen.name}; ttft_ms={chosen.ttft_s * 1e3:.0f}; itl_ms={chosen.itl_s * 1e3:.1f};"
            f" reason={self.reason}"
        )

    def explain(self) -> list[str]:
        lines = [f"objective: {self.objective.describe()}"]
        for prediction in self.predictions:
            verdict = "meets" if prediction.meets(self.objective, self.margin) else "misses"
            lines.append(f"  {prediction.describe()}: {verdict}")
        if self.chosen is None:
            lines.append(f"way: none ({self.reason}): refused with 429")
        else:
            lines.append(f"way: {self.chosen.name} ({self.reason})")
        return lines


def choose(
    objective: Objective, predictions: tuple[Prediction, ...], on_miss: OnMiss, margin: float = 0.0
) -> Plan:
    """The first of `predictions` (cheapest first) that meets `objective` with `margin` to
    spare; else by `on_miss`: the smallest shortfall (the cheaper on a tie), a node to wait
    for (where a node is among the ways), or none."""
    for prediction in predictions:
        if prediction.meets(objective, margin):
            return Plan(objective, predictions, prediction, "meets", margin)
    if on_miss == "reject" or not predictions:
        return Plan(objective, predictions, None, "none_meets", margin)
    if on_miss == "queue":
        node = next((p for p in predictions if p.way == "tilert"), None)
        if node is not None:
            return Plan(objective, predictions, node, "queue", margin)
    best = min(predictions, key=lambda p: p.shortfall(objective))
    return Plan(objective, predictions, best, "least_miss", margin)


@dataclass(frozen=True, slots=True)
class Planned:
    """What a request's paths need of its plan: the way, the servers the prediction was
    made for (the paths serve it there), and for a node, its deadline."""

    prediction: Prediction
    native: Prediction | None = None
    """The native way to serve it: the chosen one, or for a node, the best native way to
    go to should no node come in time."""
    node_deadline_s: float | None = None
    """`tilert`: by when (seconds after the plan) a node must be had to meet the objective;
    it orders the request among the waiters of its priority."""
    leave_at_deadline: bool = False
    """`tilert`: stop waiting for a node at that deadline (the rule's `on_miss`)."""

    @property
    def way(self) -> Way:
        return self.prediction.way


def planned(plan: Plan, on_miss: OnMiss) -> Planned | None:
    """What the paths are told of `plan` (None for a refusal)."""
    chosen = plan.chosen
    if chosen is None:
        return None
    if chosen.way != "tilert":
        return Planned(chosen, chosen)
    natives = [p for p in plan.predictions if p.way != "tilert"]
    best_native = min(natives, key=lambda p: p.shortfall(plan.objective), default=None)
    return Planned(
        chosen,
        best_native,
        node_deadline_s=chosen.node_deadline_s(plan.objective),
        leave_at_deadline=on_miss != "queue",
    )
