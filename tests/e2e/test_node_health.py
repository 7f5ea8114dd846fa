"""Node health end to end: a node failing requests is taken out of the pool (the gate no
longer hands it out), and the prober lets it back in once it answers and is idle."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from sim.stack import SimStack
from tests.support.deployment import directive, latency_model, sim_post, version_args
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.http import plain

COOLDOWN_S = 1.5


@pytest.fixture(scope="module")
def stack(tilert_version: str) -> Iterator[SimStack]:
    version = version_args(tilert_version)
    with SimStack(
        nodes=4,
        prefills=1,
        model=["ds", "pair"],
        node_args=["--step-ms", "1", *version["node_args"]],
        prefill_args=version["prefill_args"],
    ) as running:
        yield running


@pytest.fixture(scope="module")
def gateway(
    stack: SimStack, tilert_version: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    models = [
        latency_model(stack, "ds", nodes=stack.nodes[:2], tilert=tilert_version),
        latency_model(stack, "pair", nodes=stack.nodes[2:], tilert=tilert_version),
    ]
    with start_gateway(
        tmp_path_factory,
        models,
        gate={"failure_threshold": 2, "node_cooldown_s": COOLDOWN_S, "probe_interval_s": 0.05},
        admin={"api_key": "operator-secret"},
    ) as running:
        yield running


def chat(gateway: GatewayProcess, text: str, model: str = "ds") -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": directive(text)}]}
    return plain().post(gateway.base_url + "/chat/completions", json=body, timeout=30)


def test_failing_nodes_go_out_and_come_back(stack: SimStack, gateway: GatewayProcess) -> None:
    ids = [n.url.removeprefix("http://") for n in stack.nodes[:2]]
    for node in stack.nodes[:2]:
        sim_post(node.url, "/sim/faults", {"decode_500": True, "count": 2})
    started = time.monotonic()
    failures = [chat(gateway, "x").status_code for _ in range(4)]
    assert failures == [502] * 4
    pool = gateway.pool()["models"]["ds"]
    assert time.monotonic() - started < COOLDOWN_S, "checked within the cool-down"
    assert pool["out"] == dict.fromkeys(ids, "decode_failed")

    shed = chat(gateway, "x")
    assert shed.status_code == 429
    assert shed.json()["error"]["code"] == "no_node"
    assert int(shed.headers["retry-after"]) >= 1

    gateway.wait_all_free()  # the prober readmits both once the cool-down has passed
    reply = chat(gateway, "back again")
    assert reply.status_code == 200
    assert reply.json()["choices"][0]["message"]["content"] == "back again"


def test_a_node_that_dies_is_taken_out_and_the_other_serves(
    stack: SimStack, gateway: GatewayProcess
) -> None:
    dead = stack.nodes[3]
    os.kill(dead.pid, signal.SIGKILL)
    # Nodes are handed out in turn: within two requests one lands on the dead node.
    first = [chat(gateway, f"reply {i}", model="pair") for i in range(2)]
    failed = [a for a in first if a.status_code != 200]
    assert len(failed) == 1 and failed[0].json()["error"]["code"] == "node_unreachable"
    assert gateway.pool()["models"]["pair"]["out"] == {
        dead.url.removeprefix("http://"): "node_unreachable"
    }
    # From now on only the live node is used.
    assert [chat(gateway, f"again {i}", model="pair").status_code for i in range(3)] == [200] * 3


def test_an_operator_drains_and_undrains_a_node(stack: SimStack, gateway: GatewayProcess) -> None:
    node = stack.nodes[0]
    node_id = node.url.removeprefix("http://")
    admin = gateway.url + f"/admin/nodes/{node_id}"
    assert plain().post(admin + "/drain", timeout=5).status_code == 401
    assert (
        plain().post(gateway.url + "/admin/nodes/nowhere:1/drain", headers=gateway.admin_headers)
    ).status_code == 404
    drained = plain().post(admin + "/drain", headers=gateway.admin_headers, timeout=5)
    assert drained.json() == {"node": node_id, "models": ["ds"], "drained": True}
    assert gateway.pool()["models"]["ds"]["out"] == {node_id: "drained"}
    before = len(plain().get(node.url + "/sim/records", timeout=5).json()["decodes"])
    assert [chat(gateway, f"while drained {i}").status_code for i in range(4)] == [200] * 4
    after = len(plain().get(node.url + "/sim/records", timeout=5).json()["decodes"])
    assert after == before, "a drained node takes no new request"
    plain().post(admin + "/undrain", headers=gateway.admin_headers, timeout=5).raise_for_status()
    assert gateway.pool()["models"]["ds"]["out"] == {}
    assert [chat(gateway, f"after {i}").status_code for i in range(4)] == [200] * 4
    final = len(plain().get(node.url + "/sim/records", timeout=5).json()["decodes"])
    assert final > after, "back in service"
