"""Tests marked `serial` run alone while pytest-xdist runs the others side by side.

They assert timings (gaps between chunks, an order decided within a node's hold) that
CPU taken by a test on another worker would spoil. Every other test holds a shared lock
for the whole of its run (fixture set-up and teardown included); a `serial` test holds
it exclusively through its set-up and call, and lets go when its teardown starts (which
asserts nothing). A turnstile taken before either keeps a waiting `serial` test from
being overtaken by the shared holders forever. Locks are files under the run's own
directory, so two runs on one machine do not wait for each other; without xdist there
is nothing to lock.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path


def lock_dir() -> Path | None:
    """The directory the workers of this xdist run share (None outside xdist)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return None
    path = Path(tempfile.gettempdir()) / f"pd-gateway-serial-{run}"
    path.mkdir(exist_ok=True)
    return path


@contextmanager
def _locked(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # releases the lock


WAITED_S = {"serial": 0.0, "other": 0.0}
"""Seconds this worker's tests waited for their turn, `serial` ones and the others."""
LONG_WAITS: list[tuple[float, str]] = []
"""(seconds, test) for each wait of this worker's over a second."""


@contextmanager
def turn(serial: bool, test: str = "") -> Iterator[Callable[[], None]]:
    """Hold the run exclusively (`serial`) or shared with other non-serial tests; what it
    gives lets go of the hold before the block ends (a `serial` test's teardown, which
    asserts nothing and need not keep the other workers waiting)."""
    directory = lock_dir()
    if directory is None:
        yield lambda: None
        return
    turnstile, running = directory / "turnstile", directory / "running"
    asked = time.monotonic()
    with ExitStack() as held:
        if serial:  # the turnstile kept: no other test starts until this one ends
            held.enter_context(_locked(turnstile, fcntl.LOCK_EX))
            held.enter_context(_locked(running, fcntl.LOCK_EX))
        else:
            with _locked(turnstile, fcntl.LOCK_EX):
                held.enter_context(_locked(running, fcntl.LOCK_SH))
        waited = time.monotonic() - asked
        WAITED_S["serial" if serial else "other"] += waited
        if waited > 1.0:
            LONG_WAITS.append((waited, test))
        yield held.close
