"""A replica paused (`SIGSTOP`) past its lease while its prefill still waits at vLLM, on a
real Redis and real gateway processes: the node goes out as `lease_expired` and serves the
other replica again without the stale transfer ever reaching another request, and the
replica, once resumed, never sends the node anything more.

* TileRT 0.1.6: the prober flushes the node in the stale request's name, so the node
  refuses that request's transfer when it finally comes; the node serves again at once.
* TileRT 0.1.5 takes any transfer that arrives: the node stays out until the prefill's
  deadline has passed since the lease expired, and is flushed only then.

The judges are the simulators' own records: the prefill server's transfers, the node's
decodes and corruptions.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sim.stack import NodeInfo, SimStack
from tests.gate.redis_server import RedisServer, running_redis
from tests.support.deployment import (
    corruptions,
    directive,
    gateway_config,
    latency_model,
    sim_get,
    sim_post,
    tier_rules,
    version_args,
)
from tests.support.gateway import GatewayProcess, running_gateways
from tests.support.http import plain
from tests.support.stacks import StackPool
from tests.support.waiting import wait_until

pytestmark = pytest.mark.serial

LEASE_TTL_S = 2.0
# How long the paused replica's prefill waits at vLLM before it runs: past the lease's
# expiry and the prober's flush (0.1.6), within the deadline after it (0.1.5).
QUEUED_S = 5.0
PREFILL_S = 6.0  # the gateway's prefill deadline: how long a 0.1.5 node stays out


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


def stack_of(sim_stacks: StackPool, release: str) -> SimStack:
    args = version_args(release)
    return sim_stacks.get(
        nodes=1,
        prefills=1,
        model="ds",
        node_args=[*args["node_args"], "--step-ms", "3"],
        prefill_args=[*args["prefill_args"], "--itl-ms", "0", "--prefill-ms-per-token", "0"],
    )


def replica_config(stack: SimStack, redis: RedisServer, release: str) -> dict[str, Any]:
    return gateway_config(
        [latency_model(stack, "ds", tilert=release)],
        gate={
            "backend": "redis",
            "redis": {
                "url": redis.url,
                "key_prefix": f"paused-{uuid.uuid4().hex[:12]}",
                "lease_ttl_s": LEASE_TTL_S,
                "renew_every_s": 0.5,
                "poll_s": 0.2,
            },
        },
        timeouts={"prefill_s": PREFILL_S},
        classification={"rules": tier_rules()},
    )


def chat(gateway: GatewayProcess, text: str) -> httpx.Response:
    return plain().post(
        gateway.base_url + "/chat/completions",
        json={"model": "ds", "messages": [{"role": "user", "content": directive(text)}]},
        timeout=60,
    )


def out_reason(gateway: GatewayProcess, node: NodeInfo) -> str | None:
    out: dict[str, str] = gateway.pool()["models"]["ds"]["out"]
    return out.get(f"{node.host}:{node.http_port}")


def transfers_of(stack: SimStack, rid: str) -> list[dict[str, Any]]:
    transfers = sim_get(stack.prefills[0].url, "/sim/requests")["transfers"]
    return [t for t in transfers if t["rid"] == rid]


def test_a_replica_paused_past_its_lease_never_reaches_its_node_again(
    tilert_version: str,
    sim_stacks: StackPool,
    redis: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    release = tilert_version
    stack = stack_of(sim_stacks, release)
    node, prefill = stack.nodes[0], stack.prefills[0]
    config = replica_config(stack, redis, release)
    with running_gateways(tmp_path_factory, {"paused": config, "other": config}) as running:
        paused, other = running["paused"], running["other"]
        assert chat(other, "warm").status_code == 200  # both know the pool's state epoch
        assert chat(paused, "warm").status_code == 200
        sim_post(prefill.url, "/sim/reset")
        sim_post(node.url, "/sim/reset")

        sim_post(prefill.url, "/sim/faults", {"queued_ms": QUEUED_S * 1000, "count": 1})
        answers: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: answers.append(chat(paused, "stale")))
        sender.start()
        wait_until(
            lambda: sim_get(prefill.url, "/sim/faults")["faults"] == {},
            what="the paused replica's prefill to reach vLLM",
        )
        paused.pause()
        try:
            wait_until(
                lambda: out_reason(other, node) == "lease_expired", what="the lease to expire"
            )
            expired_at = time.monotonic()
            wait_until(lambda: out_reason(other, node) is None, what="readmission")
            readmitted_after_s = time.monotonic() - expired_at
            served = chat(other, "served meanwhile")

            def stale_transfer_ended() -> bool:
                rid = sim_get(prefill.url, "/sim/requests")["requests"][0]["rid"]
                transfers = transfers_of(stack, rid) if rid else []
                return bool(transfers) and all(t["end"] is not None for t in transfers)

            wait_until(stale_transfer_ended, what="the stale prefill's transfer to end")
            stale_rid = sim_get(prefill.url, "/sim/requests")["requests"][0]["rid"]
        finally:
            paused.resume()
        sender.join(timeout=60)

        assert served.status_code == 200, served.text
        assert served.json()["choices"][0]["message"]["content"] == "served meanwhile"
        outcomes = {t["outcome"] for t in transfers_of(stack, stale_rid)}
        if release == "0.1.6":
            assert outcomes == {"refused_cancelling"}, outcomes  # fenced at the node
        else:
            # Taken by the node while it was out, and flushed only after the deadline.
            assert readmitted_after_s >= PREFILL_S - 0.5, readmitted_after_s
        (answer,) = answers
        assert answer.status_code != 200, "the paused request cannot have been served"
        # The stale request's name reached the node once: the prober's flush. The resumed
        # replica neither decoded nor consumed nor cancelled there.
        decodes = sim_get(node.url, "/sim/records")["decodes"]
        assert [d["rid"] for d in decodes].count(stale_rid) == 1, decodes
        assert corruptions(stack) == []
        after = chat(paused, "after the pause")
        assert after.status_code == 200, after.text
