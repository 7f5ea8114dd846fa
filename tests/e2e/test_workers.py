"""`server.workers: 2`: two gateway processes on one socket, one TileRT pool through Redis.

Both workers serve (each has handled requests), a scrape of either counts every request,
a worker killed outright is replaced and nothing is lost from the counts, and SIGTERM
stops them all cleanly; a killed supervisor takes its workers along.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sim.stack import SimStack
from tests.gate.redis_server import RedisServer, running_redis
from tests.support.classify_fixtures import proxy_throughput
from tests.support.deployment import directive, gateway_config, latency_model
from tests.support.gateway import GatewayProcess
from tests.support.http import plain
from tests.support.processes import running
from tests.support.stacks import StackPool

pytestmark = pytest.mark.usefixtures("fresh_sims")

TEXT = "two workers, one pool"
WORKERS = 2


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=2,
        prefills=1,
        proxy=True,
        model="ds",
        node_args=["--step-ms", "2"],
        prefill_args=["--itl-ms", "0", "--prefill-ms-per-token", "0"],
    )


def start(
    stack: SimStack, redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    config = gateway_config(
        [latency_model(stack, "ds", throughput=proxy_throughput(stack))],
        gate={
            "backend": "redis",
            "redis": {"url": redis.url, "key_prefix": f"workers-{uuid.uuid4().hex[:12]}"},
            "max_queue_wait_ms": 30_000,
        },
    )
    config["server"] = {**config.get("server", {}), "workers": WORKERS}
    config["logging"] = {"access_log": True}
    # Access lines are at info.
    with GatewayProcess(config, tmp_path_factory.mktemp("workers"), log_level="info") as running:
        yield running


@pytest.fixture
def gateway(
    stack: SimStack, redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    yield from start(stack, redis, tmp_path_factory)


def workers(gateway: GatewayProcess) -> list[int]:
    """The supervisor's children."""
    pid = int(gateway.proc_status().split("\nPid:\t", 1)[1].split("\n", 1)[0])
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return sorted(int(c) for c in children)


def requests_per_worker(gateway: GatewayProcess, total: int) -> Counter[int]:
    """Latency-path requests each worker answered, from the access lines naming it, once
    `total` lines are in the log (or 10 s have passed). A worker writes a request's line
    after its answer has ended, so the client may have it before the log does."""
    deadline = time.monotonic() + 10
    while True:
        lines = gateway.log_path.read_text().splitlines()
        counts = Counter(
            int(line.split(" worker=", 1)[1].split(" ", 1)[0])
            for line in lines
            if " path=latency" in line and " worker=" in line
        )
        if counts.total() >= total or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)


def chat(gateway: GatewayProcess, client: httpx.Client) -> None:
    body = {
        "model": "ds",
        "messages": [{"role": "user", "content": directive(TEXT)}],
        "stream": True,
    }
    with client.stream("POST", gateway.base_url + "/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["x-pd-route"] == "latency"
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert '"content":"workers' in "".join(lines).replace(" ", "")


def served(gateway: GatewayProcess, count: int) -> None:
    """`count` requests from 8 clients at once, each on its own connection (the kernel
    spreads connections, not requests, over the workers)."""

    def one(_: int) -> None:
        with httpx.Client(timeout=30) as client:
            chat(gateway, client)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))


def answered(gateway: GatewayProcess) -> float:
    """Latency-path requests answered, as one scrape reports them."""
    text = plain().get(gateway.url + "/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "pd_gateway_requests"
        for sample in family.samples
        if sample.name == "pd_gateway_requests_total" and sample.labels["path"] == "latency"
    )


def test_both_workers_serve_and_every_scrape_counts_all_of_them(gateway: GatewayProcess) -> None:
    pids = workers(gateway)
    assert len(pids) == WORKERS
    served(gateway, 40)
    per_worker = requests_per_worker(gateway, 40)
    assert sorted(per_worker) == pids, f"not every worker served: {per_worker}"
    assert sum(per_worker.values()) == 40
    # A scrape lands on either worker (a new connection each time): every one counts 40.
    assert {answered(gateway) for _ in range(6)} == {40.0}
    # ... and shows every worker's process series, whichever worker answers it.
    assert all(process_pids(gateway) == pids for _ in range(4))
    gateway.wait_all_free()


def process_pids(gateway: GatewayProcess) -> list[int]:
    text = plain().get(gateway.url + "/metrics", timeout=10).text
    return sorted(
        int(sample.labels["pid"])
        for family in text_string_to_metric_families(text)
        if family.name == "process_cpu_seconds"
        for sample in family.samples
    )


def test_a_killed_worker_is_replaced_and_its_counts_remain(gateway: GatewayProcess) -> None:
    served(gateway, 10)
    victim = workers(gateway)[0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while (now := workers(gateway)) == [] or victim in now or len(now) < WORKERS:
        assert time.monotonic() < deadline, f"no replacement for worker {victim}: {now}"
        time.sleep(0.05)
    served(gateway, 10)
    assert answered(gateway) == 20.0
    gateway.wait_all_free(dead=())


def test_sigterm_stops_every_worker_cleanly(gateway: GatewayProcess) -> None:
    pids = workers(gateway)
    gateway.signal(signal.SIGTERM)
    assert gateway.wait_exit() == 0
    assert not [pid for pid in pids if running(pid)]


def test_a_killed_supervisor_takes_its_workers_along(gateway: GatewayProcess) -> None:
    pids = workers(gateway)
    gateway.kill()
    deadline = time.monotonic() + 10
    while left := [pid for pid in pids if running(pid)]:
        assert time.monotonic() < deadline, f"workers outlived their supervisor: {left}"
        time.sleep(0.05)
