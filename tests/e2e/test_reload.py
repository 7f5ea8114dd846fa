"""Reloading the configuration while a stream runs: the stream is untouched, new requests
follow the new rules and nodes, a configuration that does not load changes nothing, a vLLM
server the gateway ejected stays ejected through a reload that still names it, and SIGHUP
does what `POST /admin/reload` does."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from sim.stack import SimStack
from tests.support.classify_fixtures import proxy_throughput
from tests.support.deployment import (
    directive,
    gateway_config,
    latency_model,
    request_decodes,
    sim_get,
)
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.http import plain
from tests.support.stacks import StackPool

pytestmark = pytest.mark.usefixtures("fresh_sims")

ADMIN = {"authorization": "Bearer operator-key"}
BATCH_RULE = {
    "default": {"name": "interactive", "path": "latency"},
    "rules": [
        {"name": "batch", "match": {"headers": {"x-workload": "batch"}}, "path": "throughput"}
    ],
}
LONG_TEXT = " ".join(f"word{i}" for i in range(80))


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=2, prefills=1, proxy=True, model="ds", node_args=["--step-ms", "20"]
    )


def config(
    stack: SimStack,
    *,
    node: int,
    rules: dict[str, Any] | None,
    proxies: list[str] | None = None,
) -> dict[str, Any]:
    """`proxies`: the proxy URLs (the stack's one proxy by default)."""
    throughput = proxy_throughput(stack)
    if proxies is not None:
        throughput["urls"] = proxies
    model = latency_model(stack, "ds", nodes=[stack.nodes[node]], throughput=throughput)
    classification = {"rules": rules} if rules is not None else {}
    return gateway_config([model], classification=classification, admin={"api_key": "operator-key"})


@pytest.fixture(scope="module")
def started(stack: SimStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    first = config(stack, node=0, rules=None)
    with start_gateway(
        tmp_path_factory,
        first["models"],
        classification=first["classification"],
        admin=first["admin"],
    ) as running:
        yield running


@pytest.fixture
def gateway(started: GatewayProcess, stack: SimStack) -> GatewayProcess:
    """The module's gateway, reloaded back to its first configuration (node 0, no rules)
    and idle: each test starts where a new gateway would."""
    rewrite(started, config(stack, node=0, rules=None))
    answer = plain().post(started.url + "/admin/reload", headers=ADMIN, timeout=30)
    assert answer.status_code == 200, answer.text
    started.wait_all_free()
    return started


def rewrite(gateway: GatewayProcess, document: dict[str, Any]) -> None:
    # Keep the port the gateway was started with (a reload keeps `server` anyway).
    gateway.config_path.write_text(yaml.safe_dump(document), encoding="utf-8")


def chat(gateway: GatewayProcess, text: str, **headers: str) -> httpx.Response:
    body = {"model": "ds", "messages": [{"role": "user", "content": directive(text)}]}
    return plain().post(
        gateway.base_url + "/chat/completions", json=body, headers=headers, timeout=30
    )


def decodes(stack: SimStack, node: int) -> int:
    return len(request_decodes(sim_get(stack.nodes[node].url, "/sim/records")["decodes"]))


def test_a_reload_leaves_the_running_stream_alone_and_changes_what_comes_next(
    gateway: GatewayProcess, stack: SimStack
) -> None:
    lines: list[str] = []
    started = threading.Event()

    def stream() -> None:
        body = {
            "model": "ds",
            "messages": [{"role": "user", "content": directive(LONG_TEXT)}],
            "stream": True,
        }
        with plain().stream(
            "POST", gateway.base_url + "/chat/completions", json=body, timeout=60
        ) as r:
            for line in r.iter_lines():
                lines.append(line)
                started.set()

    running = threading.Thread(target=stream)
    running.start()
    assert started.wait(10)

    rewrite(gateway, config(stack, node=1, rules=BATCH_RULE))  # node 0 leaves, node 1 joins
    answer = plain().post(gateway.url + "/admin/reload", headers=ADMIN, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["models"] == {"ds": "changed"}

    batch = chat(gateway, "ok", **{"x-workload": "batch"})
    assert (batch.headers["x-pd-route"], batch.headers["x-pd-rule"]) == ("throughput", "batch")
    served_by_node0 = decodes(stack, 0)
    assert chat(gateway, "ok").headers["x-pd-route"] == "latency"
    assert decodes(stack, 1) == 1, "the node added by the reload serves new requests"

    running.join(30)
    events = [line for line in lines if line]
    text = "".join(events)
    assert events[-1] == "data: [DONE]"
    assert "word79" in text, "the stream that started before the reload ran to its end"
    assert decodes(stack, 0) == served_by_node0 == 1, "the removed node took nothing new"


def test_a_configuration_that_does_not_load_changes_nothing(
    gateway: GatewayProcess, stack: SimStack
) -> None:
    rewrite(gateway, config(stack, node=0, rules=BATCH_RULE))
    assert plain().post(gateway.url + "/admin/reload", headers=ADMIN, timeout=30).status_code == 200
    broken = config(stack, node=0, rules=None)
    broken["classificaton"] = {}  # a typo
    rewrite(gateway, broken)
    refused = plain().post(gateway.url + "/admin/reload", headers=ADMIN, timeout=30)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "config_invalid" and "did you mean 'classification'" in error["message"]
    batch = chat(gateway, "ok", **{"x-workload": "batch"})
    assert batch.headers["x-pd-rule"] == "batch", "the last good configuration still serves"


def test_an_ejected_server_stays_ejected_through_a_reload_and_starts_fresh_once_removed(
    gateway: GatewayProcess, stack: SimStack
) -> None:
    assert stack.proxy is not None
    live = stack.proxy.url
    with socket.socket() as held:  # a port bound, never listened on: refused at once
        held.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{held.getsockname()[1]}"
        both = [dead, live]

        def reload_with(node: int, proxies: list[str]) -> None:
            rewrite(gateway, config(stack, node=node, rules=BATCH_RULE, proxies=proxies))
            answer = plain().post(gateway.url + "/admin/reload", headers=ADMIN, timeout=30)
            assert answer.status_code == 200, answer.text
            assert answer.json()["models"] == {"ds": "changed"}

        reload_with(0, both)
        for i in range(40):  # half of them tried on the dead server first, then retried
            if proxy_servers(gateway)[dead]["state"] == "ejected":
                break
            batch = chat(gateway, f"ok {i}", **{"x-workload": "batch"})
            assert batch.status_code == 200, batch.text
        before = proxy_servers(gateway)[dead]
        assert before["state"] == "ejected", before

        reload_with(1, both)  # another node: the model changes, the proxies do not
        after = proxy_servers(gateway)[dead]
        # Out, or between two ejections (a back-off that ended a moment ago).
        assert after["state"] in ("ejected", "probation"), after
        assert after["ejections"] >= before["ejections"] >= 1
        assert after["failures"] >= before["failures"] >= 5

        reload_with(1, [live])
        reload_with(1, both)  # removed, then added back: a server never judged
        again = proxy_servers(gateway)[dead]
        assert again["ejections"] == 0 and again["state"] in ("healthy", "failing"), again


def proxy_servers(gateway: GatewayProcess) -> dict[str, dict[str, Any]]:
    """The proxy URLs of the model as `GET /admin/upstreams` shows them."""
    answer = plain().get(gateway.url + "/admin/upstreams", headers=ADMIN, timeout=30)
    assert answer.status_code == 200, answer.text
    servers: dict[str, dict[str, Any]] = answer.json()["models"]["ds"]["proxy"]
    return servers


def test_reloading_needs_the_admin_key(gateway: GatewayProcess) -> None:
    assert plain().post(gateway.url + "/admin/reload", timeout=30).status_code == 401


def test_sighup_reloads(gateway: GatewayProcess, stack: SimStack) -> None:
    rewrite(gateway, config(stack, node=0, rules=BATCH_RULE))
    gateway.signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    while chat(gateway, "ok", **{"x-workload": "batch"}).headers["x-pd-rule"] != "batch":
        assert time.monotonic() < deadline, "SIGHUP did not reload the configuration"
        time.sleep(0.05)


@pytest.mark.parametrize("tokenizer", ["missing", "corrupt", "not a tokenizer", "unknown name"])
def test_an_unusable_tokenizer_is_refused_as_invalid_configuration(
    gateway: GatewayProcess, stack: SimStack, tokenizer: str
) -> None:
    workdir = gateway.config_path.parent
    (workdir / "corrupt.json").write_bytes(b'{"version": "1.0", "model": {"type": "BP')
    (workdir / "other.json").write_text('{"name": "not a tokenizer"}', encoding="utf-8")
    spec = {
        "missing": str(workdir / "nowhere" / "tokenizer.json"),
        "corrupt": str(workdir / "corrupt.json"),
        "not a tokenizer": str(workdir / "other.json"),
        "unknown name": "no-such-tokenizer",
    }[tokenizer]
    broken = config(stack, node=0, rules=BATCH_RULE)
    broken["models"][0]["tokenizer"] = spec
    rewrite(gateway, broken)
    logged = len(gateway.log_path.read_text().splitlines())

    refused = plain().post(gateway.url + "/admin/reload", headers=ADMIN, timeout=30)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "config_invalid"
    assert "models[0] (ds).tokenizer" in error["message"] and spec in error["message"]
    gateway.signal(signal.SIGHUP)
    new_lines = wait_for_lines(gateway, logged, 2)
    assert all("the configuration was not reloaded" in line for line in new_lines), new_lines
    assert chat(gateway, "ok", **{"x-workload": "batch"}).headers["x-pd-rule"] == "default"
    log = "\n".join(gateway.log_path.read_text().splitlines()[logged:])
    assert "Traceback" not in log and "never retrieved" not in log, log


def wait_for_lines(gateway: GatewayProcess, after: int, count: int) -> list[str]:
    """The log's lines past the first `after`, once there are `count` of them."""
    deadline = time.monotonic() + 20
    while True:
        lines = gateway.log_path.read_text().splitlines()[after:]
        if len(lines) >= count:
            return lines
        assert time.monotonic() < deadline, f"expected {count} log lines, got {lines}"
        time.sleep(0.05)
