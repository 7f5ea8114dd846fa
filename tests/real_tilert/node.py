"""Starts TileRT's own decode node (`tilert_node.py`, one release, on `.venv-tilert`'s
Python) as a process of its own, tied to the test process, and stops it.

`RealNode.start()` returns once the node has printed its ready line and `/health` answers;
`info` is then a `sim.stack.NodeInfo` (the gateway's configuration and the tests take a
real node where they take a simulated one), and `log_text()` what TileRT logged.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from sim.stack import NodeInfo
from tests.real_tilert.install import PYTHON, release_dir
from tests.support.installer import WRITES_BYTECODE
from tests.support.processes import ready_line, stop_group
from tests.support.tethered import tether

LAUNCHER = Path(__file__).with_name("tilert_node.py")
READY_PREFIX = "TILERT-READY "
START_TIMEOUT_S = 60.0  # importing torch: 3 s on a quiet machine
STOP_GRACE_S = 5.0


class RealNode:
    """One TileRT decode node of `release` (0.1.5 or 0.1.6); `args` as `tilert_node.py`
    takes them, `env` added to its environment (`TILERT_DECODE_POLL_MS`, ...)."""

    def __init__(
        self,
        release: str,
        log_path: Path,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.release = release
        self.log_path = log_path
        self._args = args or []
        self._env = env or {}
        self._proc: subprocess.Popen[str] | None = None
        self.ready: dict[str, Any] = {}
        self.info: NodeInfo | None = None

    def start(self) -> RealNode:
        environment = {
            **os.environ,
            **self._env,
            **WRITES_BYTECODE,
            "PYTHONPATH": str(release_dir(self.release)),
            "PYTHONUNBUFFERED": "1",
        }
        with self.log_path.open("w") as log:  # the process keeps its own copy
            self._proc = subprocess.Popen(
                [str(PYTHON), "-P", str(LAUNCHER), *self._args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=environment,
                start_new_session=True,
                preexec_fn=tether(),
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        ready = ready_line(self._proc, READY_PREFIX, deadline)
        self.ready = json.loads(ready) if ready is not None else {}
        if not self.ready:
            self.stop()
            raise RuntimeError(f"TileRT {self.release} did not start:\n{self.log_text()}")
        self.info = NodeInfo(
            "127.0.0.1", self.ready["ctrl_port"], self.ready["http_port"], None, self._proc.pid
        )
        self._await_health(deadline)
        return self

    def _await_health(self, deadline: float) -> None:
        assert self.info is not None
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.info.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)  # the ready line comes before uvicorn serves: a moment at most
        self.stop()
        raise TimeoutError(f"TileRT {self.release} not healthy:\n{self.log_text()}")

    @property
    def url(self) -> str:
        assert self.info is not None, "start() first"
        return self.info.url

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_group(proc, grace_s=STOP_GRACE_S)
