"""A node that comes back running another TileRT release while it serves a request, end to
end on both gate backends: its request finishes, it is shown out of service with the
mismatch at once, no other request is sent to it, the error is logged once, and it serves
again once it reports its pool's release and has been flushed."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sim.stack import NodeInfo, SimStack
from tests.gate.redis_server import RedisServer, running_redis
from tests.support.deployment import (
    directive,
    gateway_config,
    latency_model,
    request_decodes,
    sim_get,
    sim_post,
)
from tests.support.gateway import GatewayProcess, running_gateways
from tests.support.http import plain
from tests.support.stacks import StackPool
from tests.support.waiting import wait_until

MISMATCH = "tilert_version_mismatch: node runs 0.1.5, pool is 0.1.6"
LONG = " ".join(f"w{i % 10}" for i in range(120))  # about 2.5 s of decoding


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


@pytest.fixture
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=2,
        prefills=1,
        model="ds",
        node_args=["--protocol", "0.1.6", "--step-ms", "20", "--stream-interval-ms", "20"],
        prefill_args=["--tilert-protocol", "0.1.6", "--itl-ms", "0"],
    )


def node_id(node: NodeInfo) -> str:
    return f"{node.host}:{node.http_port}"


def chat(gateway: GatewayProcess, text: str, *, stream: bool = False) -> httpx.Response:
    body = {
        "model": "ds",
        "messages": [{"role": "user", "content": directive(text)}],
        "stream": stream,
    }
    return plain().post(gateway.base_url + "/chat/completions", json=body, timeout=60)


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_a_node_found_on_another_release_while_busy_serves_no_other_request(
    backend: str,
    stack: SimStack,
    redis: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    gate: dict[str, Any] = {"capabilities_interval_s": 0.2}
    if backend == "redis":
        gate |= {
            "backend": "redis",
            "redis": {"url": redis.url, "key_prefix": f"release-{uuid.uuid4().hex[:12]}"},
        }
    config = gateway_config([latency_model(stack, "ds")], gate=gate)
    with running_gateways(tmp_path_factory, {"gateway": config}) as running:
        gateway = running["gateway"]
        streamed: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: streamed.append(chat(gateway, LONG, stream=True)))
        sender.start()

        def busy_node() -> str | None:
            busy = gateway.pool()["models"]["ds"]["busy"]
            return next((node for node, holder in busy.items() if holder is not None), None)

        wait_until(lambda: busy_node() is not None, what="the long request to hold a node")
        held_id = busy_node()
        (changed,) = [n for n in stack.nodes if node_id(n) == held_id]
        sim_post(changed.url, "/sim/faults", {"poses_as_015": True})

        def out() -> dict[str, str]:
            return dict(gateway.pool()["models"]["ds"]["out"])

        wait_until(lambda: out().get(held_id) == MISMATCH, what="the mismatch to be shown")
        assert busy_node() == held_id, "found while its request still runs"
        others = [chat(gateway, f"meanwhile {i}") for i in range(3)]
        sender.join(timeout=60)
        others += [chat(gateway, f"after {i}") for i in range(3)]

        (stream,) = streamed
        assert stream.status_code == 200
        chunks = [json.loads(line[6:]) for line in stream.text.splitlines() if line[6:7] == "{"]
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        text = "".join(delta.get("content") or "" for delta in deltas)
        assert text == LONG, "the request it was serving finished whole"
        assert [r.status_code for r in others] == [200] * 6
        decodes = request_decodes(sim_get(changed.url, "/sim/records")["decodes"])
        assert len([d for d in decodes if d["stream"]]) == 1, "no other request was sent to it"
        log = gateway.log_path.read_text()
        assert log.count(MISMATCH) == 1, log

        sim_post(changed.url, "/sim/faults", {"poses_as_015": False})
        wait_until(lambda: held_id not in out(), what="readmission on its pool's release")
        assert chat(gateway, "back").status_code == 200
