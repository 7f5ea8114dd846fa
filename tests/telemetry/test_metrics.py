"""The metrics the gateway declares: what a request's access record puts in them, the
bounded key label, the reroute kinds, the in-flight gauge and the process collectors."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.utils import floatToGoString

import router
from router.gate import GateSnapshot
from router.telemetry.access import AccessRecord
from router.telemetry.metrics import (
    TOKEN_GAP_BUCKETS,
    UNKNOWN_KEY,
    Metrics,
    StreamGaps,
    WorkerProcesses,
    key_label,
)


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def exposition(metrics: Metrics) -> str:
    snapshot = GateSnapshot(nodes=1, busy={"n": None}, out={}, waiting=0, retry_after_s=1)
    return metrics.render({"m": snapshot}).decode()


def test_an_answered_request_counts_its_tokens_and_duration_by_path_and_key(
    metrics: Metrics,
) -> None:
    record = AccessRecord("r", model="m", path="throughput", prompt_tokens=12)
    record.completion_tokens, record.finish_reason, record.duration_ms = 5, "stop", 250.0
    metrics.answered(record, "team-a")
    metrics.answered(record, "team-a")

    tokens = {"model": "m", "path": "throughput", "key": "team-a"}
    assert sample(metrics, "pd_gateway_prompt_tokens_total", **tokens) == 24
    assert sample(metrics, "pd_gateway_completion_tokens_total", **tokens) == 10
    duration = {"model": "m", "path": "throughput", "finish_reason": "stop"}
    assert sample(metrics, "pd_gateway_request_seconds_count", **duration) == 2
    assert sample(metrics, "pd_gateway_request_seconds_sum", **duration) == pytest.approx(0.5)
    assert sample(metrics, "pd_gateway_prompt_tokens_total", model="m", path="latency") == 0


def test_an_answered_request_is_timed_by_stage_and_its_tokens_histogrammed(
    metrics: Metrics,
) -> None:
    record = AccessRecord("r", model="m", path="latency", prompt_tokens=300)
    record.queue_wait_ms, record.prefill_ms, record.ttft_ms = 20.0, 80.0, 130.0
    record.duration_ms, record.completion_tokens = 1130.0, 40
    metrics.answered(record, UNKNOWN_KEY)

    def stage(name: str) -> float:
        return sample(
            metrics, "pd_gateway_stage_seconds_sum", model="m", path="latency", stage=name
        )

    assert stage("queue") == pytest.approx(0.02)
    assert stage("prefill") == pytest.approx(0.08)
    assert stage("first_token") == pytest.approx(0.03)  # after the queue and the prefill
    assert stage("decode") == pytest.approx(1.0)
    tokens = {"model": "m", "path": "latency"}
    assert sample(metrics, "pd_gateway_request_prompt_tokens_bucket", le="256.0", **tokens) == 0
    assert sample(metrics, "pd_gateway_request_prompt_tokens_bucket", le="1024.0", **tokens) == 1
    assert sample(metrics, "pd_gateway_request_completion_tokens_bucket", le="64.0", **tokens) == 1
    assert sample(metrics, "pd_gateway_request_completion_tokens_sum", **tokens) == 40


def test_stages_a_request_did_not_go_through_are_not_observed(metrics: Metrics) -> None:
    native = AccessRecord("r", model="m", path="throughput", ttft_ms=50.0, duration_ms=60.0)
    metrics.answered(native, UNKNOWN_KEY)
    failed = AccessRecord("f", model="m", path="latency", queue_wait_ms=5.0)  # no first token
    metrics.answered(failed, UNKNOWN_KEY)
    observed = {
        (sample.labels["path"], sample.labels["stage"])
        for family in metrics.registry.collect()
        if family.name == "pd_gateway_stage_seconds"
        for sample in family.samples
        if sample.name.endswith("_count")
    }
    assert observed == {
        ("throughput", "first_token"),
        ("throughput", "decode"),
        ("latency", "queue"),
    }


def test_requests_are_counted_by_endpoint(metrics: Metrics) -> None:
    metrics.request("m", "responses", "latency", "r", 200)
    counted = {"model": "m", "endpoint": "responses", "path": "latency", "rule": "r"}
    assert sample(metrics, "pd_gateway_requests_total", status="200", **counted) == 1


def test_a_cut_answer_is_timed_without_a_finish_reason_and_counts_no_tokens(
    metrics: Metrics,
) -> None:
    record = AccessRecord("r", model="m", path="latency", duration_ms=1000.0)
    metrics.answered(record, UNKNOWN_KEY)
    timed = {"model": "m", "path": "latency", "finish_reason": ""}
    assert sample(metrics, "pd_gateway_request_seconds_count", **timed) == 1
    assert "pd_gateway_prompt_tokens_total{" not in exposition(metrics)


def test_key_labels_are_configured_names_only() -> None:
    configured = frozenset({"team-a", "team-b"})
    assert key_label("team-a", configured) == "team-a"
    assert key_label("sent-in-a-header-7f3a", configured) == UNKNOWN_KEY
    assert key_label(None, configured) == UNKNOWN_KEY
    assert key_label("team-a", frozenset()) == UNKNOWN_KEY


def test_first_tokens_and_token_gaps_are_per_path(metrics: Metrics) -> None:
    metrics.first_token("m", "latency", 0.2)
    metrics.first_token("m", "throughput", 0.4)
    gaps = metrics.stream_gaps("m", "throughput")
    gaps.line(0.03, 3)
    gaps.line(0.03, 0)  # a line without tokens: not a gap
    gaps.flush()
    assert sample(metrics, "pd_gateway_ttft_seconds_count", model="m", path="latency") == 1
    assert sample(metrics, "pd_gateway_ttft_seconds_sum", model="m", path="throughput") == 0.4
    gap = {"model": "m", "path": "throughput"}
    assert sample(metrics, "pd_gateway_inter_token_seconds_count", **gap) == 1
    assert sample(metrics, "pd_gateway_inter_token_seconds_sum", **gap) == pytest.approx(0.01)


def test_a_streams_gaps_reach_the_histogram_as_observing_each_would(metrics: Metrics) -> None:
    """Counted per bucket and added a batch at a time: every bucket, the count and the sum
    as `Histogram.observe` of each gap makes them, bounds included; nothing before a
    batch is full or the stream flushes, every gap after."""
    registry = CollectorRegistry()
    reference = Histogram("gaps", "", buckets=TOKEN_GAP_BUCKETS, registry=registry)
    gaps = metrics.stream_gaps("m", "latency")
    values = [*TOKEN_GAP_BUCKETS[:-1], 0.0, 7.0, *(i / 997 for i in range(StreamGaps.BATCH + 40))]
    for value in values:
        gaps.line(value * 2, 2)
        reference.observe(value)
    where = {"model": "m", "path": "latency"}
    assert sample(metrics, "pd_gateway_inter_token_seconds_count", **where) == StreamGaps.BATCH
    gaps.flush()
    gaps.flush()  # nothing pending: nothing added twice
    for bound in (*TOKEN_GAP_BUCKETS, float("inf")):
        le = floatToGoString(bound)
        expected = registry.get_sample_value("gaps_bucket", {"le": le})
        assert sample(metrics, "pd_gateway_inter_token_seconds_bucket", le=le, **where) == expected
    assert sample(metrics, "pd_gateway_inter_token_seconds_count", **where) == len(values)
    total = sample(metrics, "pd_gateway_inter_token_seconds_sum", **where)
    assert total == pytest.approx(registry.get_sample_value("gaps_sum"))


def test_guard_reroutes_and_spills_are_told_apart(metrics: Metrics) -> None:
    metrics.reroute("m", "logit_bias", spill=False)
    metrics.reroute("m", "queue_full", spill=True)
    metrics.reroute("m", "queue_full", spill=True)
    reroutes = "pd_gateway_reroutes_total"
    assert sample(metrics, reroutes, model="m", kind="guard", reason="logit_bias") == 1
    assert sample(metrics, reroutes, model="m", kind="spill", reason="queue_full") == 2


def test_the_in_flight_gauge_rises_and_falls(metrics: Metrics) -> None:
    gauge = metrics.in_flight("latency")
    gauge.inc()
    gauge.inc()
    assert sample(metrics, "pd_gateway_requests_in_flight", path="latency") == 2
    gauge.dec()
    assert sample(metrics, "pd_gateway_requests_in_flight", path="latency") == 1


def test_the_process_and_platform_series_are_exposed(metrics: Metrics) -> None:
    text = exposition(metrics)
    assert "\nprocess_cpu_seconds_total " in text
    assert "\nprocess_resident_memory_bytes " in text
    assert "python_info{" in text
    version = f'version="{router.__version__}"'
    assert f'pd_gateway_build_info{{python="{platform.python_version()}",{version}}} 1.0' in text


def test_every_worker_s_process_series_are_labelled_with_its_pid() -> None:
    families = {family.name: family for family in WorkerProcesses().collect()}
    pids = {sample.labels["pid"] for sample in families["process_cpu_seconds"].samples}
    assert str(os.getpid()) in pids
    assert all(sample.value >= 0 for sample in families["process_cpu_seconds"].samples)


def test_every_gateway_metric_is_in_the_operations_guide(metrics: Metrics) -> None:
    guide = (Path(__file__).parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
    exposition(metrics)
    names = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in metrics.registry.collect()
        if family.name.startswith("pd_gateway_")
    }
    assert names, "no gateway metric found"
    assert {name for name in names if f"`{name}" not in guide and f" {name}" not in guide} == set()
