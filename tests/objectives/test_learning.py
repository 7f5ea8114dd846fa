"""What an ended answer teaches: from its access record, the timings of the server or node
that served it, and for a planned request, its prediction's error and whether its
objective was met."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from policies import Objective
from router.config import ObjectivesConfig
from router.objectives import Timings, WayFacts, predict
from router.objectives.learning import learn
from router.objectives.prediction import Planned
from router.selection import Choice
from router.telemetry.access import AccessRecord
from router.telemetry.metrics import Metrics

DECODE = Choice("http://decode-a", "load")


def answered(**fields: object) -> AccessRecord:
    record = AccessRecord("r", model="m", status=200, **fields)  # type: ignore[arg-type]
    return record


def with_gaps(record: AccessRecord, gap_s: float, tokens: int) -> AccessRecord:
    for _ in range(tokens):
        record.token_gap(gap_s, 1)
    return record


def test_a_split_answer_teaches_the_prefill_the_hand_off_and_the_decode_gap() -> None:
    timings = Timings(ObjectivesConfig())
    for _ in range(3):
        record = answered(
            path="throughput",
            native_way="split",
            upstream=DECODE.url,
            running=2,
            prefill="http://prefill-a",
            prefill_ms=100.0,
            prefill_tokens=1000,
            ttft_ms=140.0,
        )
        learn(timings, with_gaps(record, 0.012, 10), None)
    assert timings.handoff_s("split") == pytest.approx(0.040)
    assert timings.gap_s(DECODE.url, 2) == pytest.approx(0.012)
    assert timings.prefill_s("http://prefill-a", 1000) == pytest.approx(0.100)


def test_a_node_answer_teaches_its_node_and_the_node_hand_off() -> None:
    timings = Timings(ObjectivesConfig())
    for _ in range(3):
        record = answered(
            path="latency",
            node="n0",
            prefill="http://prefill-a",
            prefill_ms=50.0,
            prefill_tokens=500,
            queue_wait_ms=200.0,
            ttft_ms=300.0,
        )
        learn(timings, with_gaps(record, 0.004, 20), None)
    assert timings.node_gap_s() == pytest.approx(0.004)
    assert timings.handoff_s("tilert") == pytest.approx(0.050)


def test_failed_or_continued_answers_teach_nothing_of_speed() -> None:
    timings = Timings(ObjectivesConfig(tilert_itl_ms=5))
    for _ in range(5):
        failed = answered(path="latency", node="n0", ttft_ms=10.0, error_code="decode_failed")
        learn(timings, with_gaps(failed, 0.5, 5), None)
        continued = answered(path="latency", node="n1", ttft_ms=10.0, continued=1)
        learn(timings, with_gaps(continued, 0.5, 5), None)
    assert timings.node_gap_s() == pytest.approx(0.005)


def test_a_planned_answer_is_judged_against_its_objective_and_its_prediction() -> None:
    metrics, timings = Metrics(), Timings(ObjectivesConfig(itl_ms=20, itl_ms_per_running=0))
    prediction = predict(WayFacts("whole", 100, DECODE, running=1), timings)
    record = answered(
        path="throughput",
        native_way="whole",
        upstream=DECODE.url,
        running=1,
        ttft_ms=prediction.ttft_s * 1e3 + 250,
        uncached_tokens=100,
    )
    with_gaps(record, 0.020, 10)
    planned = Planned(prediction, prediction)
    learn(timings, record, planned, objective=Objective(ttft_ms=100), rule="chat", metrics=metrics)
    assert record.objective_met is False
    text = generate_latest(metrics.registry).decode()
    assert (
        'pd_gateway_objective_requests_total{model="m",outcome="missed",rule="chat",way="whole"}'
        " 1.0" in text
    )
    assert (
        'pd_gateway_prediction_error_seconds_count{model="m",quantity="ttft",way="whole"} 1.0'
        in text
    )
    # 250 ms late: counted in the 0.25 s bucket, not the 0.1 s one
    labels = 'model="m",quantity="ttft",way="whole"'
    bucket = 'pd_gateway_prediction_error_seconds_bucket{{le="{}",' + labels + "}}"
    assert bucket.format("0.1") + " 0.0" in text
    assert bucket.format("0.25") + " 1.0" in text


def test_an_answer_served_another_way_than_planned_is_not_held_to_that_prediction() -> None:
    metrics, timings = Metrics(), Timings(ObjectivesConfig())
    node = predict(WayFacts("tilert", 100, prefill=DECODE, wait_s=0.1), timings)
    record = answered(path="throughput", native_way="split", upstream=DECODE.url, ttft_ms=90.0)
    learn(timings, record, Planned(node), objective=Objective(ttft_ms=100), metrics=metrics)
    assert record.objective_met is True
    text = generate_latest(metrics.registry).decode()
    assert 'outcome="met",rule="",way="split"} 1.0' in text
    assert "pd_gateway_prediction_error_seconds_count" not in text
