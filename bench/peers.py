"""Other routers measured in the same rounds, when installed.

vllm-router (the `vllm-router` package on PyPI, a Rust binary) fronts vLLM prefill and
decode servers in its PD mode (`--vllm-pd-disaggregation`, NIXL pull). On the native path
it is measured beside the gateway in pull mode over the same two simulated servers, so the
two routers that add a prefill hop are compared with each other as well as with direct.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from bench.processes import StartFailure, wait_or_kill
from router.process.lifeline import die_with_parent

VLLM_ROUTER = "vllm-router"
READY_TIMEOUT_S = 30.0


def vllm_router_executable() -> str | None:
    return shutil.which(VLLM_ROUTER)


def peer_states(measured: bool) -> dict[str, str]:
    """Each known peer and whether this run measured it."""
    if measured:
        return {VLLM_ROUTER: "measured (PD mode, NIXL pull)"}
    if vllm_router_executable() is None:
        return {VLLM_ROUTER: "not installed (pip install vllm-router)"}
    return {VLLM_ROUTER: "installed, not run (--no-peers)"}


class VllmRouterChild:
    """vllm-router in PD mode over one prefill and one decode server, in its own process
    group on a free loopback port."""

    def __init__(self, executable: str, prefill_url: str, decode_url: str, log: Path) -> None:
        port = _free_port()
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.log_path = log
        self._terminated = False
        argv = [executable, "--vllm-pd-disaggregation", "--prefill", prefill_url]
        argv += ["--decode", decode_url, "--host", "127.0.0.1", "--port", str(port)]
        with log.open("w") as output:
            self.popen = subprocess.Popen(
                [*argv, "--log-level", "warning"],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_ready(self) -> str:
        deadline = time.monotonic() + READY_TIMEOUT_S
        health = self.base_url.removesuffix("/v1") + "/health"
        while time.monotonic() < deadline and self.popen.poll() is None:
            try:
                if httpx.get(health, timeout=1).status_code == 200:
                    return self.base_url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise StartFailure("vllm-router did not start (--no-peers leaves it out)", self.log_path)

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM to its group, once), without waiting for it."""
        if not self._terminated and self.popen.poll() is None:
            self._terminated = True
            os.killpg(self.popen.pid, signal.SIGTERM)

    def stop(self) -> None:
        self.terminate()
        wait_or_kill(self.popen, 10)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
