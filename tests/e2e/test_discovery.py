"""A pool whose nodes are found by DNS (as a StatefulSet's headless Service gives them):
the gateway resolves the name before serving, and the node it finds serves requests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sim.stack import SimStack
from tests.support.deployment import directive
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.http import plain
from tests.support.stacks import StackPool

pytestmark = pytest.mark.usefixtures("fresh_sims", "all_slots_free")


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(nodes=1, prefills=1, model="m", node_args=["--step-ms", "1"])


@pytest.fixture(scope="module")
def gateway(stack: SimStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    node = stack.nodes[0]
    discover = {
        "dns": "localhost",
        "family": "ipv4",
        "ctrl_port": node.ctrl_port,
        "http_port": node.http_port,
        "interval_s": 0.2,
    }
    latency = {"prefill": [stack.prefills[0].url], "discover": discover}
    model = {"name": "m", "tokenizer": "deepseek", "latency": latency}
    with start_gateway(tmp_path_factory, [model]) as running:
        yield running


def test_the_node_found_by_dns_serves(stack: SimStack, gateway: GatewayProcess) -> None:
    node_id = f"127.0.0.1:{stack.nodes[0].http_port}"
    pool = gateway.pool()["models"]["m"]
    assert pool["nodes"] == 1 and list(pool["busy"]) == [node_id]
    assert pool["node_facts"][node_id]["tilert"] == "0.1.6"
    body = {"model": "m", "messages": [{"role": "user", "content": directive("found")}]}
    answer = plain().post(gateway.base_url + "/chat/completions", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-pd-route"] == "latency"
    assert answer.json()["choices"][0]["message"]["content"] == "found"
