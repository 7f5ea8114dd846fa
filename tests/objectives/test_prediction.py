"""Each way's prediction from its facts and the timings, the choice among them, and what
the paths are told of it."""

from __future__ import annotations

import pytest

from policies import Objective
from router.config import ObjectivesConfig
from router.objectives import Timings, WayFacts, choose, planned, predict
from router.selection import Choice

DECODE = Choice("http://decode-a", "load")
PREFILL = Choice("http://prefill-a", "load")
ASSUMED = ObjectivesConfig(
    prefill_ms_per_token=0.1,
    prefill_base_ms=20,
    itl_ms=20,
    itl_ms_per_running=2,
    tilert_itl_ms=5,
    handoff_ms=30,
)


def timings() -> Timings:
    return Timings(ASSUMED)


def test_each_way_is_predicted_from_its_parts() -> None:
    t = timings()
    whole = predict(WayFacts("whole", 1000, DECODE, running=3), t)
    assert whole.ttft_s == pytest.approx(0.020 + 0.100 + 0.020)  # base, tokens, first step
    assert whole.itl_s == pytest.approx(0.020 + 2 * 0.002)
    split = predict(WayFacts("split", 1000, DECODE, PREFILL, running=1), t)
    assert split.ttft_s == pytest.approx(0.020 + 0.100 + 0.030)
    assert split.itl_s == pytest.approx(0.020)
    node = predict(WayFacts("tilert", 1000, prefill=PREFILL, wait_s=0.5), t)
    assert node.ttft_s == pytest.approx(0.5 + 0.120 + 0.030)
    assert node.itl_s == pytest.approx(0.005)
    assert dict(node.parts) == pytest.approx({"wait": 0.5, "prefill": 0.12, "handoff": 0.03})


def test_what_was_measured_replaces_what_was_assumed() -> None:
    t = timings()
    for running in (1, 2, 3, 4, 5, 6):
        t.learn_gap(DECODE.url, running, 0.010 * running)
    for _ in range(3):
        t.learn_node_gap("n0", 0.004)
        t.learn_node_gap("n1", 0.008)
    assert predict(WayFacts("whole", 0, DECODE, running=8), t).itl_s == pytest.approx(0.080)
    node = predict(WayFacts("tilert", 0, prefill=PREFILL), t)
    assert node.itl_s == pytest.approx(0.006)  # which node is not known yet: their mean


def predictions(*facts: WayFacts) -> tuple:
    return tuple(predict(f, timings()) for f in facts)


WHOLE_BUSY = WayFacts("whole", 1000, DECODE, running=30)  # itl 20 + 29·2 = 78 ms
SPLIT = WayFacts("split", 1000, DECODE, PREFILL, running=1)  # ttft 150, itl 20
NODE = WayFacts("tilert", 1000, prefill=PREFILL, wait_s=2.0)  # ttft 2150, itl 5


def test_the_cheapest_way_that_meets_the_objective_is_taken() -> None:
    plan = choose(Objective(ttft_ms=500, itl_ms=40), predictions(WHOLE_BUSY, SPLIT, NODE), "best")
    assert plan.chosen is not None and plan.chosen.way == "split"
    assert plan.reason == "meets" and plan.meets
    assert plan.header().startswith("split; ttft_ms=150; itl_ms=20.0; reason=meets")


def test_with_none_meeting_it_best_takes_the_smallest_miss() -> None:
    plan = choose(Objective(ttft_ms=100, itl_ms=10), predictions(WHOLE_BUSY, SPLIT, NODE), "best")
    # whole: 7.8x over on itl; split: 2x on itl; node: 21.5x on ttft
    assert plan.chosen is not None and plan.chosen.way == "split"
    assert plan.reason == "least_miss" and not plan.meets


def test_with_none_meeting_it_queue_waits_for_a_node_and_reject_refuses() -> None:
    objective = Objective(ttft_ms=100, itl_ms=10)
    queued = choose(objective, predictions(WHOLE_BUSY, SPLIT, NODE), "queue")
    assert queued.chosen is not None and queued.chosen.way == "tilert"
    refused = choose(objective, predictions(WHOLE_BUSY, SPLIT, NODE), "reject")
    assert refused.chosen is None and refused.reason == "none_meets"
    assert refused.header() == "none; reason=none_meets"


def test_a_node_plan_carries_its_deadline_and_the_best_native_way() -> None:
    objective = Objective(ttft_ms=3000, itl_ms=10)
    plan = choose(objective, predictions(WHOLE_BUSY, SPLIT, NODE), "best")
    assert plan.chosen is not None and plan.chosen.way == "tilert"
    told = planned(plan, "best")
    assert told is not None
    # the node must be had by 3000 - (prefill 120 + handoff 30) ms
    assert told.node_deadline_s == pytest.approx(2.85)
    assert told.leave_at_deadline
    assert told.native is not None and told.native.way == "split"
    kept = planned(plan, "queue")
    assert kept is not None and not kept.leave_at_deadline


def test_an_itl_objective_alone_sets_no_node_deadline() -> None:
    plan = choose(Objective(itl_ms=10), predictions(WHOLE_BUSY, NODE), "best")
    told = planned(plan, "best")
    assert told is not None and told.way == "tilert" and told.node_deadline_s is None


def test_the_explanation_names_every_way_and_the_choice() -> None:
    plan = choose(Objective(ttft_ms=500), predictions(WHOLE_BUSY, SPLIT, NODE), "best")
    text = "\n".join(plan.explain())
    assert "whole on http://decode-a: ttft 140.0 ms" in text
    assert "tilert: ttft 2150.0 ms (wait 2000.0, prefill 120.0, handoff 30.0)" in text
    assert text.endswith("way: whole (meets)")
