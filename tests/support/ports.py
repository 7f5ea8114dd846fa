"""Ports for servers that bind long after their port is chosen.

A port found free by binding port 0 is an ephemeral port: until the server that was told
it binds it (a vLLM server's HTTP port and NIXL side channel, 20 s and more after its
launch), the kernel may hand it to any other socket of the machine, another test's
`bind(("127.0.0.1", 0))` or an outgoing connection. `unclaimed_port` picks below the
kernel's ephemeral range, where only an explicit choice lands, from a block of its own for
each pytest-xdist worker, and never the same port twice in one process.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

BLOCK = 1_000
FIRST = 10_000  # below every usual ephemeral range (Linux: 32768-60999)
_given: set[int] = set()


def ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def worker_block() -> range:
    """This process's block: pytest-xdist's `gw<n>` has block n, a run without workers 0."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) if worker.isdigit() else 0
    start = FIRST + index * BLOCK
    if start + BLOCK > ephemeral_floor():
        raise RuntimeError(f"no ports below the ephemeral range for worker {index}")
    return range(start, start + BLOCK)


def bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def unclaimed_port() -> int:
    """A free port below the ephemeral range, not given before by this process."""
    candidates = [p for p in worker_block() if p not in _given]
    random.shuffle(candidates)  # two runs on one machine rarely start at the same port
    for port in candidates:
        if bindable(port):
            _given.add(port)
            return port
    raise RuntimeError(f"every port of {worker_block()} is taken")
