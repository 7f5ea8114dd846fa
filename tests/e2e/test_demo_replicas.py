"""`pd-gateway demo --replicas 2` as a real process: one base URL in front of two gateway
replicas sharing the pool through the demo's own Redis. An OpenAI SDK client is served on
both paths; one replica is killed with SIGKILL while it streams, and the client's requests
still succeed through the other; SIGINT then stops every process the demo started."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.support.demo import Demo, descendants, running_demo
from tests.support.deployment import directive
from tests.support.processes import running

USAGE_END = "Ctrl-C stops the gateway replicas, Redis and every simulator."
STOPPING = "Stopping the gateway replicas, Redis and the simulators."
START_TIMEOUT_S = 120.0
LEASE_TTL_S = 3.0  # the demo's lease (demo/run.py DEMO_REDIS)
MESSAGES = [{"role": "user", "content": "Say hello"}]


def announced_replicas(demo: Demo) -> dict[str, tuple[str, int]]:
    """name -> (URL, pid), as the demo announced them."""
    found = (re.fullmatch(r"  (replica \d+): (\S+)  pid (\d+)", line) for line in demo.output)
    return {m[1]: (m[2], int(m[3])) for m in found if m}


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    with running_demo(
        tmp_path / "demo.err", "--replicas", "2", ready=USAGE_END, timeout_s=START_TIMEOUT_S
    ) as running:
        yield running


def ask(client: OpenAI, **extra: object) -> tuple[str, str]:
    """(path taken, text) of one chat completion."""
    raw = client.chat.completions.with_raw_response.create(
        model="deepseek-v3.2",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=16,
        **extra,  # type: ignore[arg-type]
    )
    return raw.headers["x-pd-route"], raw.parse().choices[0].message.content or ""


@pytest.mark.timeout(300)
def test_killing_a_replica_breaks_nothing_behind_the_demo_address(demo: Demo) -> None:
    base_url = next(line for line in demo.output if line.startswith("Base URL: "))[10:]
    children = descendants(demo.popen.pid)
    replicas = announced_replicas(demo)
    assert sorted(replicas) == ["replica 1", "replica 2"]
    assert {pid for _, pid in replicas.values()} <= children
    assert len(children) == 7 + 1 + 2  # the simulators, Redis, the replicas
    # Both paths, across both replicas (each new connection goes to the next one).
    for _ in range(4):
        with OpenAI(base_url=base_url, api_key="unused", timeout=30) as fresh:
            assert ask(fresh)[0] == "latency"
            assert ask(fresh, extra_headers={"x-workload": "batch"})[0] == "throughput"
    # A client whose kept-alive connections may lead to either replica.
    client = OpenAI(base_url=base_url, api_key="unused", timeout=30, max_retries=0)
    for _ in range(4):
        assert ask(client)[1]

    # Kill replica 1 while it streams a long answer from a node it holds.
    victim_url, victim_pid = replicas["replica 1"]
    body = {
        "model": "deepseek-v3.2",
        "messages": [{"role": "user", "content": directive(" ".join(["w"] * 600))}],
        "max_tokens": 2000,
        "stream": True,
    }
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", victim_url + "/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and '"content":"' in line:
                break
        os.kill(victim_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        demo.read_until(r"replica 1 \(pid \d+\) exited with code -9; 1 of 2 replicas serving", 30)

    # The same client carries on: every request succeeds, on one path or the other, while
    # the dead replica's node is held until its lease expires, and after.
    paths = []
    while time.monotonic() - killed_at < LEASE_TTL_S + 3:
        path, text = ask(client)
        assert text
        paths.append(path)
        stream = client.chat.completions.create(
            model="deepseek-v3.2",
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=16,
            stream=True,
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert "latency" in paths
    client.close()

    demo.popen.send_signal(signal.SIGINT)
    assert demo.exit_code(90) == 0
    demo.read_until(re.escape(STOPPING), 5)
    assert not [pid for pid in children if running(pid)]
