"""`pd-gateway demo` as a real process: both paths answer an OpenAI SDK client, and SIGINT
stops every process the demo started and frees every port."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from openai import OpenAI

from router.config import load_config
from router.server import READY_PREFIX

pytestmark = pytest.mark.e2e

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONFIG_PREFIX = "Gateway configuration: "
USAGE_END = "Ctrl-C stops the gateway and every simulator."
START_TIMEOUT_S = 90.0


class Demo:
    """The demo process, its stdout as lines, and what it announced."""

    def __init__(self, stderr: Path) -> None:
        with stderr.open("w") as log:  # the process keeps its own copy
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "router.cli", "demo", "--free-ports"],
                cwd=PROJECT_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        self.children: set[int] = set()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        with self.popen.stdout:  # closed once the demo has gone
            for line in self.popen.stdout:
                self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def read_until(self, last: str, timeout_s: float) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            if line is None:
                raise AssertionError("the demo exited early:\n" + "\n".join(self.output))
            self.output.append(line)
            if line == last:
                return self.output

    def announced(self, prefix: str) -> str:
        return next(line[len(prefix) :] for line in self.output if line.startswith(prefix))


def descendants(root: int) -> set[int]:
    """Every live process below `root`, found through /proc (not through the demo's word)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [root]
    while todo:
        children = parents.get(todo.pop(), [])
        found.update(children)
        todo.extend(children)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def ports_of(config_file: str, base_url: str) -> set[int]:
    config = load_config(config_file)
    ports = {int(base_url.rsplit(":", 1)[1].split("/")[0])}
    for model in config.models:
        if model.latency is not None:
            ports |= {p for n in model.latency.nodes for p in (n.ctrl_port, n.http_port)}
            ports |= {int(u.rsplit(":", 1)[1]) for u in model.latency.prefill}
        throughput: Any = model.throughput
        for url in getattr(throughput, "decode", []):
            ports.add(int(url.rsplit(":", 1)[1]))
        for engine in getattr(throughput, "prefill", []):
            if not isinstance(engine, str):
                ports |= {int(engine.url.rsplit(":", 1)[1]), engine.side_channel_port}
    return ports


def bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    running = Demo(tmp_path / "demo.err")
    try:
        running.read_until(USAGE_END, START_TIMEOUT_S)
        running.children = descendants(running.popen.pid)
        yield running
    finally:
        # Only if the test failed half-way: leave nothing behind.
        if running.popen.poll() is None:
            os.killpg(running.popen.pid, signal.SIGKILL)
            running.popen.wait()
        for pid in running.children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(180)
def test_demo_serves_both_paths_and_stops_everything_on_sigint(demo: Demo) -> None:
    base_url = demo.announced(READY_PREFIX)
    assert demo.announced("Base URL: ") == base_url
    ports = ports_of(demo.announced(CONFIG_PREFIX), base_url)
    children = demo.children
    assert len(children) == 8  # 4 simulators for deepseek-v3.2, 3 for glm-5, the gateway
    assert not [port for port in ports if bindable(port)]  # all of them are listening

    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)
    messages = [{"role": "user", "content": "Say hello"}]
    for model in ("deepseek-v3.2", "glm-5"):
        plain = client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,
            max_tokens=16,  # type: ignore[arg-type]
        )
        assert plain.headers["x-pd-route"] == "latency"
        assert plain.parse().choices[0].finish_reason == "length"
        batch = client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=16,
            extra_headers={"x-workload": "batch"},
        )
        assert (batch.headers["x-pd-route"], batch.headers["x-pd-rule"]) == ("throughput", "batch")
        message = batch.parse().choices[0].message
        # GLM thinks unless told not to: its filler output is all reasoning, on both paths.
        assert message.content or (message.model_extra or {}).get("reasoning_content")
    stream = client.chat.completions.create(
        model="deepseek-v3.2",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=16,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text

    demo.popen.send_signal(signal.SIGINT)
    assert demo.popen.wait(timeout=60) == 0
    assert "Stopping the gateway and the simulators." in demo.read_until(
        "Stopping the gateway and the simulators.", 5
    )
    assert not [pid for pid in children if alive(pid)]
    assert [port for port in ports if not bindable(port)] == []


def test_demo_fails_cleanly_when_a_configured_port_is_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from router.cli import main

    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        prefill_port = spare.getsockname()[1]  # free again once closed
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        node_port = taken.getsockname()[1]
        node = {"host": "127.0.0.1", "ctrl_port": node_port, "http_port": node_port}
        latency = {"prefill": [f"http://127.0.0.1:{prefill_port}"], "nodes": [node]}
        config = {"models": [{"name": "m", "tokenizer": "deepseek", "latency": latency}]}
        path = tmp_path / "router.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        before = descendants(os.getpid())
        assert main(["demo", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: a simulator of m did not start (a port in use? try --port-offset")
    assert descendants(os.getpid()) <= before
