"""Runs the gateway as a real process (`pd-gateway serve`) on a free port, for end-to-end tests.

`start_gateway` and `running_gateways` are what fixtures use: each gateway gets its own
directory (its router.yaml and gateway.log) and is stopped when the block ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.process.server import READY_PREFIX
from tests.support.deployment import gateway_config
from tests.support.gateway_python import gateway_python
from tests.support.http import plain
from tests.support.processes import ready_line, stop_group


class GatewayProcess:
    def __init__(
        self,
        config: dict[str, Any],
        workdir: Path,
        *,
        log_level: str = "warning",
        python: str | None = None,
        release: Path | None = None,
    ) -> None:
        """`python`: the interpreter (gateway_python()'s by default); `release`: a folder
        another release of the gateway is installed in (`pip install --target`), which it
        then runs instead of the checkout's: first on its path, from its own directory."""
        self.config_path = workdir / "router.yaml"
        self.config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        self._config = config
        self.log_path = workdir / "gateway.log"
        self._log_level = log_level
        self._python = python or gateway_python()
        self._release = release
        self._workdir = workdir
        self._proc: subprocess.Popen[str] | None = None
        self.base_url = ""
        self.url = ""

    def start(self, timeout_s: float = 60.0) -> GatewayProcess:
        argv = ["serve", "--config", str(self.config_path), "--port", "0"]
        env, cwd = None, None
        if self._release is not None:  # `python -m` looks in the current directory first
            env, cwd = {**os.environ, "PYTHONPATH": str(self._release)}, self._workdir
        with self.log_path.open("w") as log:  # the process keeps its own copy
            self._proc = subprocess.Popen(
                [self._python, "-m", "router.cli", *argv, "--log-level", self._log_level],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
                env=env,
                cwd=cwd,
            )
        ready = ready_line(self._proc, READY_PREFIX, time.monotonic() + timeout_s)
        if ready is not None:
            self.base_url = ready
            self.url = self.base_url.removesuffix("/v1")
            return self
        self.stop()
        raise RuntimeError(f"the gateway did not start:\n{self.log_path.read_text()}")

    def pool(self) -> dict[str, Any]:
        response = plain().get(self.url + "/admin/pool", headers=self.admin_headers, timeout=5)
        response.raise_for_status()
        return response.json()

    @property
    def admin_headers(self) -> dict[str, str]:
        key = (self._config.get("admin") or {}).get("api_key")
        return {"authorization": f"Bearer {key}"} if key else {}

    def wait_all_free(self, timeout_s: float = 15.0, *, dead: Iterable[str] = ()) -> dict[str, Any]:
        """Poll the gateway's own pool state until no slot is held, no cleanup runs, and
        every node is in service again (except `dead`: node ids meant to stay out)."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.pool()
            busy = [
                (m, n)
                for m, s in state["models"].items()
                for n, h in s["busy"].items()
                if h is not None
            ]
            out = [n for s in state["models"].values() for n in s["out"] if n not in dead]
            if not busy and not out and state["background_tasks"] == 0:
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"slots still held after {timeout_s} s: {state}")
            time.sleep(0.05)

    def proc_status(self) -> str:
        """The process's /proc status (memory figures among others)."""
        assert self._proc is not None
        return Path(f"/proc/{self._proc.pid}/status").read_text()

    def signal(self, sig: int) -> None:
        assert self._proc is not None
        self._proc.send_signal(sig)

    def wait_exit(self, timeout_s: float = 30.0) -> int:
        assert self._proc is not None
        return self._proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        """SIGKILL the gateway's process group: it dies without any clean-up."""
        assert self._proc is not None
        os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()

    def pause(self) -> None:
        """SIGSTOP the gateway's process group: it stops where it is, as on a frozen host."""
        assert self._proc is not None
        os.killpg(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        os.killpg(self._proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM (in-flight requests finish), SIGKILL after 15 s; whatever of its process
        group is left (its workers), killed too."""
        if self._proc is not None:
            stop_group(self._proc, grace_s=15)

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def running_gateways(
    tmp_path_factory: pytest.TempPathFactory,
    configs: Mapping[str, dict[str, Any]],
    *,
    log_level: str = "warning",
) -> Iterator[dict[str, GatewayProcess]]:
    """Start one gateway per config in parallel (each takes ~2 s to load its tokenizers);
    `log_level` "info" writes the access lines to each one's log."""
    root = tmp_path_factory.mktemp("gateways")
    gateways: dict[str, GatewayProcess] = {}
    for name, config in configs.items():
        workdir = root / name
        workdir.mkdir()
        gateways[name] = GatewayProcess(config, workdir, log_level=log_level)
    try:
        with ThreadPoolExecutor(max_workers=len(gateways)) as pool:
            for started in [pool.submit(g.start) for g in gateways.values()]:
                started.result()
        yield gateways
    finally:
        for gateway in gateways.values():
            gateway.stop()


@contextmanager
def start_gateway(
    tmp_path_factory: pytest.TempPathFactory,
    models: list[dict[str, Any]],
    *,
    log_level: str = "warning",
    **options: Any,
) -> Iterator[GatewayProcess]:
    """One gateway serving `models`; `options` as `gateway_config` takes them."""
    config = gateway_config(models, **options)
    with running_gateways(tmp_path_factory, {"gateway": config}, log_level=log_level) as one:
        yield one["gateway"]
