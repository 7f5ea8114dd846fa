"""A tenant's requests let in by its limits: OpenAI's headers on every answer, a 429 over a
limit (the request's unit given back when its tokens do not fit), tokens settled with the
usage, what a store out of reach does, and bounded tracking."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import pytest
from prometheus_client import generate_latest

from router.config import TenantsConfig
from router.errors import Overloaded, Unavailable
from router.gate import UNSHARED, Share
from router.telemetry.access import AccessRecord
from router.telemetry.metrics import Metrics
from router.tenants.admission import Tenants, duration, used_tokens
from router.tenants.limiter import (
    LimiterUnavailable,
    LimiterUnreadable,
    MemoryLimiter,
    Rate,
    Verdict,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Background:
    """What the tenants spawn, run to the end before a test looks."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []

    def __call__(self, coro: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.ensure_future(coro))

    async def settled(self) -> None:
        await asyncio.gather(*self.tasks)


def tenants(limiter: Any = None, **config: Any) -> tuple[Tenants, Background]:
    background = Background()
    made = Tenants(
        TenantsConfig(**config),
        MemoryLimiter(clock=Clock()) if limiter is None else limiter,
        Metrics(),
        background,
    )
    return made, background


async def test_each_answer_says_what_is_left_and_a_request_over_the_limit_is_a_429() -> None:
    limited, _ = tenants(every={"requests_per_minute": 3})
    remaining = []
    for _ in range(3):
        admitted = await limited.admit("acme", 10)
        remaining.append(admitted.headers["x-ratelimit-remaining-requests"])
        assert admitted.headers["x-ratelimit-limit-requests"] == "3"
    assert remaining == ["2", "1", "0"]
    with pytest.raises(Overloaded) as refused:
        await limited.admit("acme", 10)
    error = refused.value
    assert (error.status, error.code) == (429, "rate_limit_exceeded")
    assert error.headers["Retry-After"] == "20"  # a request's share of the minute
    assert error.headers["x-ratelimit-remaining-requests"] == "0"
    assert "tenant 'acme'" in error.message
    assert (await limited.admit("other", 10)).headers["x-ratelimit-remaining-requests"] == "2"


async def test_a_request_whose_tokens_do_not_fit_gives_its_request_back() -> None:
    limited, background = tenants(every={"requests_per_minute": 10, "tokens_per_minute": 100})
    assert (await limited.admit("acme", 80)).headers["x-ratelimit-remaining-tokens"] == "20"
    with pytest.raises(Overloaded) as refused:
        await limited.admit("acme", 30)
    assert refused.value.headers["x-ratelimit-remaining-tokens"] == "20"
    await background.settled()
    again = await limited.admit("acme", 10)
    assert again.headers["x-ratelimit-remaining-requests"] == "8"  # 2 taken, not 3


async def test_tokens_are_settled_with_the_usage() -> None:
    limited, background = tenants(every={"tokens_per_minute": 100})
    admitted = await limited.admit("acme", 80)  # prompt and max_tokens
    limited.settle(admitted, 30)  # what the answer used
    await background.settled()
    assert (await limited.admit("acme", 0)).headers["x-ratelimit-remaining-tokens"] == "70"
    overrun = await limited.admit("acme", 10)
    limited.settle(overrun, 40)  # used more than taken: charged
    await background.settled()
    assert (await limited.admit("acme", 0)).headers["x-ratelimit-remaining-tokens"] == "30"


async def test_no_limit_no_headers_and_no_store_asked() -> None:
    class Unreachable:
        async def take_all(self, takes: object) -> list[Verdict]:
            raise AssertionError("asked")

    unlimited, _ = tenants(Unreachable())
    assert (await unlimited.admit("acme", 10)).headers == {}


class Down:
    async def take_all(self, takes: object) -> list[Verdict]:
        raise LimiterUnavailable("redis down")

    async def settle(self, key: str, rate: Rate, delta: int) -> None:
        raise LimiterUnavailable("redis down")

    async def close(self) -> None:
        pass


async def test_a_store_out_of_reach_lets_through_or_refuses_as_configured() -> None:
    allowing, _ = tenants(Down(), every={"requests_per_minute": 1})
    assert (await allowing.admit("acme", 1)).headers == {}
    refusing, _ = tenants(Down(), every={"requests_per_minute": 1}, on_store_unavailable="refuse")
    with pytest.raises(Unavailable) as refused:
        await refusing.admit("acme", 1)
    assert refused.value.code == "rate_limits_unavailable"


class Unreadable(Down):
    async def take_all(self, takes: object) -> list[Verdict]:
        raise LimiterUnreadable("2")

    async def settle(self, key: str, rate: Rate, delta: int) -> None:
        raise LimiterUnreadable("2")


async def test_a_bucket_of_a_version_this_release_does_not_read_is_an_error_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Let through or refused as a store out of reach is, and logged as an error and
    counted with the gate's unreadable records, for the take and the settle alike."""
    metrics, background = Metrics(), Background()
    config = TenantsConfig(every={"requests_per_minute": 1, "tokens_per_minute": 100})
    limited = Tenants(config, Unreadable(), metrics, background)
    with caplog.at_level(logging.ERROR, logger="pd_gateway.tenants"):
        admitted = await limited.admit("acme", 1)
        admitted.tokens_rate, admitted.tokens_taken = Rate(100), 1
        limited.settle(admitted, 5)
        await background.settled()
    assert admitted.headers == {}
    counted = metrics.registry.get_sample_value(
        "pd_gateway_gate_shared_records_unreadable_total", {"reason": "bucket_version"}
    )
    assert counted == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and all("format version '2'" in e for e in errors), errors


async def test_tenants_beyond_the_bound_are_forgotten_least_recently_seen_first() -> None:
    limited, _ = tenants(every={"requests_per_minute": 5}, max_tracked=100)
    for i in range(20_000):
        await limited.admit(f"name-{i}", 1)
    snapshot = limited.snapshot()
    assert snapshot["tracked"] == 100
    assert next(iter(snapshot["tenants"])) == "name-19999"  # the most recent first


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.02, "20ms"), (0.0, "0ms"), (1.0, "1s"), (1.5, "1.5s"), (360.0, "6m0s"), (61.25, "1m1.25s")],
)
def test_reset_times_as_openai_writes_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_a_tenants_node_time_and_wait_are_counted_from_its_answers() -> None:
    metrics = Metrics()
    held = AccessRecord("r", path="latency", node="n0", duration_ms=1500.0, queue_wait_ms=500.0)
    metrics.tenant_answered(held, "acme")
    native = AccessRecord("r", path="throughput", duration_ms=9000.0)
    metrics.tenant_answered(native, "acme")  # no node held
    text = generate_latest(metrics.registry).decode()
    assert 'pd_gateway_tenant_node_seconds_total{tenant="acme"} 1.0' in text
    assert 'pd_gateway_tenant_queue_wait_seconds_count{tenant="acme"} 1.0' in text


@pytest.mark.parametrize(
    ("fields", "used"),
    [
        ({"prompt_tokens": 30, "completion_tokens": 12, "status": 200}, 42),
        ({"status": 429}, 0),  # refused after admission: nothing generated
        ({"status": 502, "prompt_tokens": 30}, 0),
        ({"status": 200, "ttft_ms": 50.0}, None),  # a stream without usage: not known
        ({"status": 500, "ttft_ms": 50.0}, None),  # failed mid-answer
    ],
)
def test_what_an_answer_used_is_read_off_its_record(
    fields: dict[str, Any], used: int | None
) -> None:
    assert used_tokens(AccessRecord("r", **fields)) == used


def test_a_tenants_share_is_its_weight_and_its_cap_in_the_model() -> None:
    shared, _ = tenants(
        every={"max_nodes": {"glm-5": 2}},
        named={"acme": {"weight": 3, "max_nodes": 1}},
    )
    assert shared.share_of("acme", "glm-5") == Share("acme", 3.0, 1)
    assert shared.share_of("other", "glm-5") == Share("other", 1.0, 2)
    assert shared.share_of("other", "deepseek") == Share("other", 1.0, None)
    assert tenants()[0].share_of("default", "glm-5") is UNSHARED
    unfair, _ = tenants(fair_share=False, named={"acme": {"weight": 3, "max_nodes": 1}})
    assert unfair.share_of("acme", "glm-5") is UNSHARED


async def test_node_time_spent_refuses_what_only_a_node_serves_and_keeps_the_rest() -> None:
    """An hour's quota of 10 node-seconds: charged as nodes are given back; once spent, a
    request only a node could serve is a 429 `insufficient_quota`, one with another way is
    admitted without a node, and one that needs no node is not asked about it. It comes
    back with time."""
    clock = Clock()
    quota, background = tenants(
        MemoryLimiter(clock=clock), every={"node_seconds_per_hour": 10, "requests_per_minute": 9}
    )
    admitted = await quota.admit("acme", 1, node_use="only")
    assert admitted.node_quota is not None and not admitted.nodes_refused
    quota.node_released(admitted, 4.0)
    quota.node_released(admitted, 7.0)  # 11 s: over the hour's 10
    await background.settled()
    with pytest.raises(Overloaded) as refused:
        await quota.admit("acme", 1, node_use="only")
    assert refused.value.code == "insufficient_quota" and refused.value.status == 429
    assert refused.value.retry_after_s == 360  # one node-second back takes 6 minutes
    maybe = await quota.admit("acme", 1, node_use="maybe")
    assert maybe.nodes_refused
    assert not (await quota.admit("acme", 1, node_use="none")).nodes_refused
    assert (await quota.admit("other", 1, node_use="only")).node_quota is not None
    clock.now += 360
    assert not (await quota.admit("acme", 1, node_use="only")).nodes_refused
    assert "insufficient_quota" in generate_latest(quota._metrics.registry).decode()
