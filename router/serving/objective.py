"""Serving a request whose rule gives an objective: predict each way the rule allows (from
what the gateway has measured of its servers and nodes, `router.objectives`), take the
cheapest predicted to meet it, or what `on_miss` says, and hand the request to that way's
path with the servers the prediction was made for.

The plan is in the answer's `x-pd-way` and the access record; what happened is compared
with it when the answer ends (`router.objectives.learning`). A request planned for a node
waits in the queue by its deadline and, unless `on_miss: queue`, leaves at that deadline
for the best native way (`best`) or a 429 (`reject`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from contextlib import AsyncExitStack
from functools import partial
from typing import Protocol

from policies import Decision, OnSaturation
from policies.decision import ROUTE_HEADER
from router.capacity import Sizer
from router.errors import Overloaded
from router.objectives import Plan, Timings, WayFacts, choose, planned, predict
from router.objectives.learning import learn
from router.selection import Affinity
from router.serving.base import Answer, RoutedRequest, ServePath
from router.telemetry.metrics import Metrics

WAY_HEADER = "x-pd-way"


class NativeWays(Protocol):
    """The native path's part in a plan."""

    async def affinity(self, request: RoutedRequest, *, always: bool = False) -> Affinity | None:
        """What the request offers the scorers (its prompt's blocks and length), kept on it."""
        ...

    def native_facts(
        self, request: RoutedRequest, affinity: Affinity | None, tokens: int
    ) -> list[WayFacts]:
        """Each native way's facts for `request`, on the servers it would be sent to."""
        ...


class NodeWays(Protocol):
    """The latency path's part in a plan."""

    async def tilert_facts(
        self, request: RoutedRequest, tokens: int, *, wait_s: float | None = None
    ) -> WayFacts:
        """The wait for a node (`wait_s`: as assumed, else the pool's expected wait) and the
        prefill server the request would be sent to."""
        ...

    async def retry_after_s(self) -> int:
        """When a node is likely free, for a refused client."""
        ...


class ObjectivePath:
    def __init__(
        self,
        timings: Timings,
        *,
        latency: ServePath | None,
        nodes: NodeWays | None,
        throughput: ServePath | None,
        native: NativeWays | None,
        metrics: Metrics | None = None,
        sizer: Sizer | None = None,
    ) -> None:
        """`latency`: the latency path as a fixed rule reaches it (spilling to `throughput`
        where the model has one); `nodes`, `native`: what the two paths know for a plan;
        `sizer`: the model's pool sizing, which hears of every prefill as its answer ends."""
        self.timings = timings
        self.sizer = sizer
        self._latency = latency
        self._nodes = nodes
        self._throughput = throughput
        self._native = native
        self._metrics = metrics

    def learning(self, request: RoutedRequest) -> Callable[[], None]:
        """What `request`'s answer teaches once it has ended (any request of the model)."""
        return partial(_learn, self.timings, request, self._metrics, self.sizer)

    async def open(self, request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        decision = request.decision
        plan = await self.plan(request)
        if not plan.predictions:  # none of the rule's ways fits this request: the native path
            assert self._throughput is not None
            return await self._throughput.open(request, stack)
        if plan.chosen is None:
            if self._metrics is not None:
                self._metrics.objective(request.model, decision.rule, "none", "refused")
            retry_after_s = await self._nodes.retry_after_s() if self._nodes is not None else 1
            raise Overloaded(
                f"no way of serving this request is predicted to meet its objective"
                f" ({plan.objective.describe()}); retry later",
                retry_after_s=retry_after_s,
                code="objective_unattainable",
            )
        request.planned = told = planned(plan, decision.on_miss)
        if told is not None and told.way == "tilert" and self._latency is not None:
            spill = told.native is not None and decision.on_miss == "best"
            request.decision = _saturating(decision, "spill" if spill else "queue")
            return await self._latency.open(request, stack)
        assert self._throughput is not None
        return await self._throughput.open(request, stack)

    async def plan(self, request: RoutedRequest, *, node_wait_s: float | None = None) -> Plan:
        """Each allowed way predicted, cheapest first, and the choice; written into the
        answer's `x-pd-way` and the access record. `node_wait_s`: the wait for a node as
        assumed (`pd-gateway classify`), instead of asking the pool."""
        decision = request.decision
        assert decision.objective is not None
        ways = decision.ways
        affinity = None
        native_ways = [w for w in ways if w != "tilert"]
        if native_ways and self._native is not None:
            affinity = await self._native.affinity(request, always=True)
        tokens = (
            affinity.tokens
            if affinity is not None and affinity.tokens
            else decision.prompt_tokens_estimate()
        )
        facts: list[WayFacts] = []
        offered: dict[str, WayFacts] = {}
        for way in ways:  # in the rule's order of cost
            if way == "tilert":
                if self._nodes is not None and not request.nodes_refused:
                    facts.append(
                        await self._nodes.tilert_facts(request, tokens, wait_s=node_wait_s)
                    )
                continue
            if self._native is None:
                continue
            if not offered:
                offered = {f.way: f for f in self._native.native_facts(request, affinity, tokens)}
                if list(offered) == ["whole"] and offered["whole"].label:  # the proxy's one way
                    offered["split"] = offered["whole"]
            if (found := offered.get(way)) is not None and found not in facts:
                facts.append(found)
        predictions = tuple(predict(f, self.timings) for f in facts)
        margin = self.timings.config.margin
        plan = choose(decision.objective, predictions, decision.on_miss, margin)
        if predictions:  # else no plan: the native path serves it as it would
            _record(request, plan)
        return plan


def _saturating(decision: Decision, on_saturation: OnSaturation) -> Decision:
    return dataclasses.replace(decision, on_saturation=on_saturation)


def _record(request: RoutedRequest, plan: Plan) -> None:
    access, chosen = request.access, plan.chosen
    access.way_reason = plan.reason
    request.headers[WAY_HEADER] = plan.header()
    if chosen is None:
        return
    request.headers[ROUTE_HEADER] = "latency" if chosen.way == "tilert" else "throughput"
    access.way = chosen.name
    access.predicted_ttft_ms = _ms(chosen.ttft_s)
    access.predicted_itl_ms = _ms(chosen.itl_s)
    access.uncached_tokens = chosen.facts.uncached


def _ms(seconds: float) -> float | None:
    """For the access line: None for a time that cannot be told (no node can serve)."""
    return round(seconds * 1e3, 3) if math.isfinite(seconds) else None


def _learn(
    timings: Timings, request: RoutedRequest, metrics: Metrics | None, sizer: Sizer | None
) -> None:
    learn(
        timings,
        request.access,
        request.planned,
        objective=request.decision.objective,
        rule=request.decision.rule,
        metrics=metrics,
        timed=request.endpoint.name != "responses",
    )
    if sizer is not None:
        sizer.answered(request.access)
