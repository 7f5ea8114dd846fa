"""`pd-gateway demo --replicas 2` as a real process: one base URL in front of two gateway
replicas sharing the pool through the demo's own Redis. An OpenAI SDK client is served on
both paths; one replica is killed with SIGKILL while it streams, and the client's requests
still succeed through the other; SIGINT then stops every process the demo started."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.support.deployment import directive

PROJECT_ROOT = Path(__file__).resolve().parents[2]
USAGE_END = "Ctrl-C stops the gateway replicas, Redis and every simulator."
STOPPING = "Stopping the gateway replicas, Redis and the simulators."
START_TIMEOUT_S = 120.0
LEASE_TTL_S = 3.0  # the demo's lease (router/demo/run.py DEMO_REDIS)
MESSAGES = [{"role": "user", "content": "Say hello"}]


class Demo:
    def __init__(self, stderr: Path) -> None:
        with stderr.open("w") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "router.cli", "demo", "--replicas", "2", "--free-ports"],
                cwd=PROJECT_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        with self.popen.stdout:
            for line in self.popen.stdout:
                self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def read_until(self, pattern: str, timeout_s: float) -> str:
        """The first line (from here on) matching `pattern`, a regular expression."""
        deadline = time.monotonic() + timeout_s
        while True:
            line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            if line is None:
                raise AssertionError("the demo exited early:\n" + "\n".join(self.output))
            self.output.append(line)
            if re.fullmatch(pattern, line):
                return line

    def replicas(self) -> dict[str, tuple[str, int]]:
        """name -> (URL, pid), as the demo announced them."""
        found = (re.fullmatch(r"  (replica \d+): (\S+)  pid (\d+)", line) for line in self.output)
        return {m[1]: (m[2], int(m[3])) for m in found if m}


def descendants(root: int) -> set[int]:
    """Every live process below `root`, found through /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    running = Demo(tmp_path / "demo.err")
    children: set[int] = set()
    try:
        running.read_until(re.escape(USAGE_END), START_TIMEOUT_S)
        children = descendants(running.popen.pid)
        yield running
    finally:
        if running.popen.poll() is None:  # only if the test failed half-way
            os.killpg(running.popen.pid, signal.SIGKILL)
            running.popen.wait()
        for pid in children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


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
    replicas = demo.replicas()
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
    assert demo.popen.wait(timeout=90) == 0
    demo.read_until(re.escape(STOPPING), 5)
    assert not [pid for pid in children if alive(pid)]
