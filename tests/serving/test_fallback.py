"""Spill as a composition: which failures of the first path move a request to the second,
for which rules, and what the moved request carries."""

from __future__ import annotations

import dataclasses
from contextlib import AsyncExitStack

import pytest

from router.errors import (
    DecodeError,
    GatewayError,
    InvalidRequest,
    Overloaded,
    PrefillError,
    UpstreamError,
)
from router.serving import Answer, Fallback, RoutedRequest, json_answer
from router.telemetry.metrics import Metrics
from tests.throughput.support import routed


class Failing:
    def __init__(self, error: GatewayError) -> None:
        self.error = error
        self.calls = 0

    async def open(self, request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        self.calls += 1
        raise self.error


class Answering:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []

    async def open(self, request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        self.seen.append((request.request_id, dict(request.headers)))
        return json_answer(b"{}")


def latency_request(on_saturation: str) -> RoutedRequest:
    request = routed({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    request.decision = dataclasses.replace(
        request.decision, path="latency", rule="agents", on_saturation=on_saturation
    )
    request.headers = {"x-pd-route": "latency", "x-pd-rule": "agents"}
    return request


SPILLABLE = [
    Overloaded("busy", retry_after_s=2, code="queue_full"),
    Overloaded("none", retry_after_s=2, code="no_node"),
    PrefillError("down", code="prefill_unreachable"),
    PrefillError("overloaded", status=503, code="prefill_failed"),
    DecodeError("refused", status=503, code="node_busy"),
    DecodeError("late", status=504, code="kv_transfer_timeout"),
    UpstreamError("broken", code="decode_failed"),
]
NOT_SPILLABLE = [
    PrefillError("bad request", status=400, code="prefill_failed"),
    PrefillError("too long", status=422, code="prefill_failed"),
    InvalidRequest("bad"),
]


@pytest.mark.parametrize("error", SPILLABLE, ids=lambda e: str(e.code))
async def test_spill_moves_failures_before_the_first_byte(error: GatewayError) -> None:
    metrics = Metrics()
    second = Answering()
    request = latency_request("spill")
    first_id = request.request_id
    answer = await Fallback(Failing(error), second, metrics=metrics).open(request, AsyncExitStack())
    assert answer.status == 200
    ((request_id, headers),) = second.seen
    assert headers == {
        "x-pd-route": "throughput",
        "x-pd-rule": "agents",
        "x-pd-reroute-reason": str(error.code),
    }
    assert request_id != first_id, "the failed attempt's id may still be running upstream"
    counted = metrics.registry.get_sample_value(
        "pd_gateway_reroutes_total", {"model": "m", "kind": "spill", "reason": str(error.code)}
    )
    assert counted == 1


@pytest.mark.parametrize("error", NOT_SPILLABLE, ids=lambda e: f"{e.status}")
async def test_the_clients_own_mistakes_are_not_spilled(error: GatewayError) -> None:
    second = Answering()
    with pytest.raises(type(error)):
        await Fallback(Failing(error), second, metrics=Metrics()).open(
            latency_request("spill"), AsyncExitStack()
        )
    assert second.seen == []


@pytest.mark.parametrize("on_saturation", ["queue", "reject"])
async def test_rules_that_do_not_spill_see_the_failure(on_saturation: str) -> None:
    error = Overloaded("busy", retry_after_s=2, code="queue_full")
    second = Answering()
    with pytest.raises(Overloaded):
        await Fallback(Failing(error), second, metrics=Metrics()).open(
            latency_request(on_saturation), AsyncExitStack()
        )
    assert second.seen == []


async def test_a_success_never_touches_the_second_path() -> None:
    first, second = Answering(), Failing(InvalidRequest("unused"))
    answer = await Fallback(first, second, metrics=Metrics()).open(
        latency_request("spill"), AsyncExitStack()
    )
    assert answer.status == 200
    assert second.calls == 0
    assert first.seen[0][1]["x-pd-route"] == "latency"
