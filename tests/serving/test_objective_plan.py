"""An objective's plan for a request whose tenant has spent its node time: the tilert way
is left out, however fast a node would be, and the native way is chosen."""

from __future__ import annotations

import dataclasses

from policies import Objective
from router.config import ObjectivesConfig
from router.objectives import Timings, WayFacts
from router.selection import Affinity, Choice
from router.serving import RoutedRequest
from router.serving.objective import ObjectivePath
from tests.throughput.support import DECISION, routed

DECODE = Choice("http://decode-a", "load")
PREFILL = Choice("http://prefill-a", "load")


class Nodes:
    def __init__(self) -> None:
        self.asked = 0

    async def tilert_facts(
        self, request: RoutedRequest, tokens: int, *, wait_s: float | None = None
    ) -> WayFacts:
        self.asked += 1
        return WayFacts("tilert", tokens, prefill=PREFILL, wait_s=0.0)

    async def retry_after_s(self) -> int:
        return 1


class Native:
    async def affinity(self, request: RoutedRequest, *, always: bool = False) -> Affinity | None:
        return None

    def native_facts(
        self, request: RoutedRequest, affinity: Affinity | None, tokens: int
    ) -> list[WayFacts]:
        return [WayFacts("whole", tokens, DECODE, running=40)]  # a gap far over the objective


def request(*, nodes_refused: bool) -> RoutedRequest:
    decision = dataclasses.replace(
        DECISION, objective=Objective(itl_ms=20), ways=("whole", "tilert"), on_miss="best"
    )
    made = routed({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    made.decision, made.nodes_refused = decision, nodes_refused
    return made


async def test_a_tenant_whose_node_time_is_spent_is_planned_without_a_node() -> None:
    nodes = Nodes()
    path = ObjectivePath(
        Timings(ObjectivesConfig(itl_ms=20, itl_ms_per_running=2, tilert_itl_ms=5)),
        latency=None,
        nodes=nodes,
        throughput=None,
        native=Native(),
    )
    allowed = await path.plan(request(nodes_refused=False))
    assert allowed.chosen is not None and allowed.chosen.way == "tilert"
    spent = await path.plan(request(nodes_refused=True))
    assert spent.chosen is not None and spent.chosen.way == "whole"  # the best it has
    assert [p.way for p in spent.predictions] == ["whole"]
    assert nodes.asked == 1
