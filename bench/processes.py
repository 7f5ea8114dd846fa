"""A router under test as a child process, and what /proc says of it: CPU and memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import httpx
import yaml

from router.process.lifeline import die_with_parent
from router.process.server import READY_PREFIX

NODES_IN_SERVICE_TIMEOUT_S = 30.0
LOG_TAIL_CHARS = 3000


class StartFailure(RuntimeError):
    """A router under test did not start; the message names its log and ends with its tail."""

    def __init__(self, what: str, log_path: Path) -> None:
        tail = log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        super().__init__(f"{what} (its log: {log_path}):\n{tail}")


def cpu_s(pid: int) -> float:
    """CPU time of process `pid` and its children (a gateway's workers), in seconds.

    From the scheduler's nanosecond counters where the kernel keeps them: utime and stime
    come in clock ticks (10 ms), too coarse for a few requests' worth of work. Only live
    threads count.
    """
    return sum(_own_cpu_s(member) for member in [pid, *_children(pid)])


def _own_cpu_s(pid: int) -> float:
    try:
        return (
            sum(
                int((task / "schedstat").read_text().split()[0])
                for task in Path(f"/proc/{pid}/task").iterdir()
            )
            / 1e9
        )
    except FileNotFoundError:
        return 0.0  # gone since it was listed
    except (IndexError, ValueError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def running(pid: int) -> bool:
    """Process `pid` exists and has not exited (a child not yet reaped is a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """Resident memory of process `pid` and its children (a gateway's workers; `VmHWM`: the
    sum of their peaks), in MB."""
    return sum(_own_rss_mb(member, field) for member in [pid, *_children(pid)])


def _own_rss_mb(pid: int, field: str) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return 0.0  # gone since it was listed
    for line in status.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status: not Linux?")


class GatewayChild:
    """`pd-gateway serve` with `config`, as a child in its own process group on a free
    loopback port. With `root`, it runs from that checkout of the project instead of the
    installed package (to measure another version alongside)."""

    def __init__(
        self,
        config: dict[str, Any],
        workdir: Path,
        root: Path | None = None,
        *,
        log_level: str = "warning",
    ) -> None:
        """`log_level` "info" writes the access lines into `log_path` (as the config's
        `logging` says)."""
        workdir.mkdir(parents=True, exist_ok=True)
        config_path = (workdir / "router.yaml").resolve()  # the child runs in another folder
        document = {
            **config,
            "server": {**config.get("server", {}), "host": "127.0.0.1", "port": 0},
        }
        config_path.write_text(yaml.safe_dump(document), encoding="utf-8")
        self.log_path = workdir / "gateway.log"
        self.base_url = ""
        self._terminated = False
        env = dict(os.environ, PYTHONUNBUFFERED="1", TRANSFORMERS_VERBOSITY="error")
        if root is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
        argv = [sys.executable, "-m", "router.cli", "serve", "--config", str(config_path)]
        with self.log_path.open("w") as log:
            self.popen = subprocess.Popen(
                [*argv, "--port", "0", "--log-level", log_level],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
                cwd=root or workdir,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_ready(self) -> str:
        """The announced base URL (blocks on the child's stdout until it prints it)."""
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            if line.startswith(READY_PREFIX):
                self.base_url = line[len(READY_PREFIX) :].strip()
                self._wait_nodes_in_service()
                return self.base_url
        raise StartFailure("the gateway did not start", self.log_path)

    def _wait_nodes_in_service(self) -> None:
        """Until no node is out: gateways sharing the nodes (`--baseline`) probe them at
        start-up together, and one may find a node another is flushing, and wait a probe."""
        pool = self.base_url.removesuffix("/v1") + "/admin/pool"
        deadline = time.monotonic() + NODES_IN_SERVICE_TIMEOUT_S
        while time.monotonic() < deadline:
            answer = httpx.get(pool, timeout=5)
            if answer.status_code != 200:  # an admin key is configured: nothing to wait on
                return
            if not any(model["out"] for model in answer.json()["models"].values()):
                return
            time.sleep(0.1)
        raise StartFailure("the gateway's nodes stayed out of service", self.log_path)

    def terminate(self) -> None:
        """Ask the gateway to stop (SIGTERM to its group, once), without waiting for it."""
        if not self._terminated and self.popen.poll() is None:
            self._terminated = True
            os.killpg(self.popen.pid, signal.SIGTERM)

    def stop(self) -> None:
        self.terminate()
        wait_or_kill(self.popen, 15)
        if self.popen.stdout is not None:
            self.popen.stdout.close()


def wait_or_kill(popen: subprocess.Popen[Any], timeout_s: float) -> None:
    """Wait `timeout_s` for a child asked to stop, then kill its process group."""
    try:
        popen.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()


class Stoppable(Protocol):
    """A child that is asked to stop (`terminate`), then waited for (`stop`)."""

    def terminate(self) -> None: ...

    def stop(self) -> None: ...


def stop_all(children: Iterable[Stoppable]) -> None:
    """Stop every child at once: each is asked to, then each is waited for. A gateway takes
    a fifth of a second to close, which adds up when a dozen are stopped one by one."""
    children = list(children)
    for child in children:
        child.terminate()
    for child in children:
        child.stop()


def reset_peak_rss(pid: int) -> None:
    """Start `VmHWM` of process `pid` and its children again from their resident size."""
    for member in [pid, *_children(pid)]:
        try:
            Path(f"/proc/{member}/clear_refs").write_text("5")
        except FileNotFoundError:
            pass  # gone since it was listed
