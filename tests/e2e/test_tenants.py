"""Tenants through running gateways: rules match a request's tenant; the OpenAI SDK, as a
client, sees the 429 and OpenAI's `x-ratelimit-*` headers, and its own retry succeeds; three
replicas on one real Redis keep one rate and one cap on the nodes held for a tenant between
them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from sim.stack import SimStack
from tests.gate.redis_server import RedisServer, running_redis
from tests.support.classify_fixtures import (
    ROUTE,
    observed,
    proxy_throughput,
    say,
    wait_until,
    words,
)
from tests.support.deployment import gateway_config, latency_model
from tests.support.gateway import GatewayProcess, running_gateways, start_gateway
from tests.support.stacks import StackPool

MODEL = "sim-tenants"
RULES = {
    "default": {"name": "native", "path": "throughput"},
    "rules": [
        {"name": "acme-tier", "match": {"tenant": {"prefix": "acme-"}}, "path": "throughput"}
    ],
}


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=0, prefills=0, proxy=True, model=[MODEL], proxy_args=["--itl-ms", "0"]
    )


def model(stack: SimStack) -> dict[str, Any]:
    return {"name": MODEL, "tokenizer": "deepseek", "throughput": proxy_throughput(stack)}


@pytest.fixture(scope="module")
def gateway(stack: SimStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tenants = {"identify": ["user"], "every": {"requests_per_minute": PER_MINUTE}}
    with start_gateway(
        tmp_path_factory, [model(stack)], classification={"rules": RULES}, tenants=tenants
    ) as running:
        yield running


PER_MINUTE = 20  # a request comes back every 3 s


def chat(user: str) -> dict[str, Any]:
    return {**say("ok", max_tokens=4), "model": MODEL, "user": user}


def until_refused(http: httpx.Client, user: str) -> httpx.Response:
    """Requests of `user` until one is refused (a minute's worth, and what came back
    meanwhile)."""
    for _ in range(PER_MINUTE * 2):
        answer = http.post("/chat/completions", json=chat(user))
        if answer.status_code != 200:
            return answer
    raise AssertionError("never refused")


def test_the_sdk_sees_the_429_and_the_headers_and_its_retry_succeeds(
    gateway: GatewayProcess,
) -> None:
    user = f"acme-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=gateway.base_url, timeout=30) as http:
        answers = [http.post("/chat/completions", json=chat(user)) for _ in range(PER_MINUTE)]
        assert [a.status_code for a in answers] == [200] * PER_MINUTE  # a minute's worth at once
        assert answers[0].headers["x-pd-rule"] == "acme-tier"  # rules match the tenant
        first = answers[0].headers
        assert first["x-ratelimit-limit-requests"] == str(PER_MINUTE)
        assert first["x-ratelimit-remaining-requests"] == str(PER_MINUTE - 1)
        assert first["x-ratelimit-reset-requests"] == "3s"  # one request's share back
        refused = until_refused(http, user)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(refused.headers["retry-after"]) <= 3
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    seen = None
    with (
        httpx.Client(base_url=gateway.base_url, timeout=30) as http,
        openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as sdk,
    ):
        for _ in range(3):  # a request may come back between the 429 and the SDK's call
            until_refused(http, user)
            try:
                sdk.chat.completions.create(**chat(user))
            except openai.RateLimitError as exc:
                seen = exc
                break
    assert seen is not None
    assert seen.response.headers["x-ratelimit-limit-requests"] == str(PER_MINUTE)
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=3) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(**chat(user))  # waits, retries
    assert raw.http_response.status_code == 200
    # Another tenant has its own minute.
    with httpx.Client(base_url=gateway.base_url, timeout=30) as http:
        other = http.post("/chat/completions", json=chat(f"other-{uuid.uuid4().hex[:8]}"))
    assert other.headers["x-ratelimit-remaining-requests"] == str(PER_MINUTE - 1)


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


@pytest.fixture(scope="module")
def replicas(
    stack: SimStack, redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[GatewayProcess]]:
    config = gateway_config(
        [model(stack)],
        classification={"rules": RULES},
        gate={"backend": "redis", "redis": {"url": redis.url, "key_prefix": "tenants-e2e"}},
        tenants={"identify": ["user"], "every": {"requests_per_minute": 30}},
    )
    names = [f"replica-{i}" for i in range(3)]
    with running_gateways(tmp_path_factory, dict.fromkeys(names, config)) as running:
        yield [running[name] for name in names]


async def test_three_replicas_on_one_redis_keep_one_rate(
    replicas: list[GatewayProcess],
) -> None:
    user = f"shared-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(timeout=30) as http:
        started = asyncio.get_running_loop().time()
        answers = await asyncio.gather(
            *(
                http.post(replicas[i % 3].base_url + "/chat/completions", json=chat(user))
                for i in range(45)
            )
        )
        spent_s = asyncio.get_running_loop().time() - started
    allowed = sum(a.status_code == 200 for a in answers)
    assert {a.status_code for a in answers} <= {200, 429}
    # 30 at once, and one more for every 2 s the 45 took (a unit comes back every 2 s).
    assert 30 <= allowed <= 30 + int(spent_s / 2) + 1, (allowed, spent_s)
    refused = [a for a in answers if a.status_code == 429]
    assert refused and all(a.json()["error"]["code"] == "rate_limit_exceeded" for a in refused)


CAPPED_MODEL = "sim-tenant-caps"


@pytest.fixture(scope="module")
def node_stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(nodes=2, prefills=1, model=[CAPPED_MODEL])


@pytest.fixture(scope="module")
def capped_replicas(
    node_stack: SimStack, redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[GatewayProcess]]:
    """Three replicas of a latency pool of two nodes, a tenant capped at one of them, and
    no wait for a node (a request that cannot have one is refused at once)."""
    config = gateway_config(
        [latency_model(node_stack, CAPPED_MODEL)],
        classification={
            "rules": {"default": {"name": "now", "path": "latency", "on_saturation": "reject"}}
        },
        gate={"backend": "redis", "redis": {"url": redis.url, "key_prefix": "tenant-caps-e2e"}},
        tenants={
            "identify": ["user"],
            "named": {
                "capped": {"max_nodes": 1},
                "metered": {"node_seconds_per_hour": 0.001},  # a node-millisecond an hour
            },
        },
    )
    names = [f"capped-{i}" for i in range(3)]
    with running_gateways(tmp_path_factory, dict.fromkeys(names, config)) as running:
        yield [running[name] for name in names]


async def test_three_replicas_on_one_redis_keep_one_tenants_cap(
    node_stack: SimStack, capped_replicas: list[GatewayProcess]
) -> None:
    """The capped tenant holds a node through one replica: another replica refuses it a
    second (`tenant_max_nodes`) although a node is free, and serves another tenant on it;
    once its first stream ends, the tenant is served again."""
    first, second, third = capped_replicas

    def body(user: str, **extra: Any) -> dict[str, Any]:
        return {**say(words(20), max_tokens=8), "model": CAPPED_MODEL, "user": user, **extra}

    async with observed(node_stack, *capped_replicas) as sims:
        for node in node_stack.nodes:
            await sims.arm(node.url, {"stall_after": 2, "count": 1})
        request = sims.http.build_request(
            "POST", first.base_url + "/chat/completions", json=body("capped", stream=True)
        )
        held = await sims.http.send(request, stream=True)
        reader = held.aiter_raw()  # kept referenced: a collected reader closes the stream
        try:
            assert held.status_code == 200
            assert (await anext(reader)).startswith(b"data: ")
            for node in node_stack.nodes:  # the next decodes run to their end
                (await sims.http.delete(node.url + "/sim/faults")).raise_for_status()
            refused = await sims.http.post(
                second.base_url + "/chat/completions", json=body("capped")
            )
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "tenant_max_nodes"
            counted = 'pd_gateway_tenant_requests_total{outcome="max_nodes",tenant="capped"} 1.0'

            async def refusal_counted() -> bool:  # as the answer ends, after its last byte
                return counted in (await sims.http.get(second.url + "/metrics")).text

            await wait_until(refusal_counted, what="the capped tenant's refusal counted")
            other = await sims.http.post(third.base_url + "/chat/completions", json=body("other"))
            assert other.status_code == 200, other.text
            assert other.headers[ROUTE] == "latency"
        finally:
            await held.aclose()
        for replica in capped_replicas:
            await sims.wait_all_free(replica)
        again = await sims.http.post(second.base_url + "/chat/completions", json=body("capped"))
        assert again.status_code == 200, again.text


async def test_a_tenants_node_time_spent_on_one_replica_refuses_it_on_another(
    node_stack: SimStack, capped_replicas: list[GatewayProcess]
) -> None:
    """The node time a tenant's answer held is charged as its node is given back, on the
    shared Redis: once its hour's millisecond is spent, another replica refuses it."""
    body = {**say(words(20), max_tokens=8), "model": CAPPED_MODEL, "user": "metered"}
    async with observed(node_stack, *capped_replicas) as sims:
        first = await sims.http.post(capped_replicas[0].base_url + "/chat/completions", json=body)
        assert first.status_code == 200, first.text
        refused = None
        for _ in range(50):  # the charge lands in the background, as the node is given back
            answer = await sims.http.post(
                capped_replicas[1].base_url + "/chat/completions", json=body
            )
            if answer.status_code == 429:
                refused = answer
                break
            assert answer.status_code == 200, answer.text
        assert refused is not None, "the quota was never spent"
        assert refused.json()["error"]["code"] == "insufficient_quota"
        assert int(refused.headers["retry-after"]) > 3600  # hours of node time to come back
