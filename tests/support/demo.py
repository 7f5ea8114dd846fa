"""`pd-gateway demo` as a real process for the tests: start it, read what it prints, find
every process it started (through /proc, not through its word), and leave nothing behind."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from router.config import load_config
from tests.support.gateway_python import gateway_python
from tests.support.processes import running, stop_group
from tests.support.waiting import wait_until

PROJECT_ROOT = Path(__file__).resolve().parents[2]


class Demo:
    """The demo process (`pd-gateway demo --free-ports` plus `args`), its stdout as lines,
    and what it announced."""

    def __init__(self, stderr: Path, *args: str) -> None:
        self.stderr = stderr
        with stderr.open("w") as log:  # the process keeps its own copy
            self.popen = subprocess.Popen(
                [gateway_python(), "-m", "router.cli", "demo", *args, "--free-ports"],
                cwd=PROJECT_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
                preexec_fn=as_a_background_job,
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

    def read_until(self, pattern: str, timeout_s: float) -> str:
        """The first line from here on that matches `pattern` (a regular expression)."""
        deadline = time.monotonic() + timeout_s
        while True:
            line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            if line is None:
                raise AssertionError("the demo exited early:\n" + "\n".join(self.output))
            self.output.append(line)
            if re.fullmatch(pattern, line):
                return line

    def exit_code(self, timeout_s: float) -> int:
        """The demo's exit code once it has stopped; what it said if it does not in time."""
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            while not self.lines.empty():
                line = self.lines.get_nowait()
                self.output.append(line or "")
            said = "\n".join(self.output[-40:])
            logged = "\n".join(self.stderr.read_text(errors="replace").splitlines()[-60:])
            raise AssertionError(
                f"the demo had not stopped after {timeout_s:.0f} s\nstdout:\n{said}\n"
                f"stderr:\n{logged}"
            ) from None

    def announced(self, prefix: str) -> str:
        return next(line[len(prefix) :] for line in self.output if line.startswith(prefix))


@contextmanager
def running_demo(stderr: Path, *args: str, ready: str, timeout_s: float) -> Iterator[Demo]:
    """A demo started and read up to the line `ready` (plain text); whatever happens in the
    block, it and every process it started are gone afterwards."""
    demo = Demo(stderr, *args)
    try:
        demo.read_until(re.escape(ready), timeout_s)
        demo.children = descendants(demo.popen.pid)
        yield demo
    finally:
        # Only if the test failed half-way (or the demo did not start) is anything left:
        # the demo's group, and its children, each in a session of its own.
        children = demo.children | descendants(demo.popen.pid)
        stop_group(demo.popen, sig=signal.SIGKILL)
        for pid in children:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        wait_until(
            lambda: not [pid for pid in children if running(pid)],
            what="the demo's children to end",
            timeout_s=10,
        )


def as_a_background_job() -> None:
    """Start with SIGINT ignored, as a shell starts a background job (and every process
    a test run started from one): Ctrl-C's SIGINT must stop the demo all the same."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def descendants(root: int) -> set[int]:
    """Every live process below `root`, found through /proc."""
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


def ports_of(config_file: str, base_url: str) -> set[int]:
    """Every port the demo's gateway and simulators were configured to listen on."""
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
