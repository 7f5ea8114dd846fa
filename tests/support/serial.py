"""Tests marked `serial` run alone while pytest-xdist runs the others side by side.

They assert timings (gaps between chunks, an order decided within a node's hold) that
CPU taken by a test on another worker would spoil. Every test holds a shared lock while
its fixtures are set up; other tests keep it to the end of their teardown. A `serial`
test trades it for the lock held exclusively before its call and lets go when its
teardown starts: its set-up (starting simulators, gateways, Redis) asserts nothing, nor
does its teardown, so neither keeps the other workers waiting. A turnstile taken before
either lock keeps a waiting `serial` test from being overtaken by the shared holders
forever. Locks are files under the run's own directory, so two runs on one machine do not
wait for each other; without xdist there is nothing to lock.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import TracebackType


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


class Turn:
    """One test's hold on the run, from its set-up (`with`) to its end: shared, and for a
    `serial` test exclusive from `call()` until `teardown()`."""

    def __init__(self, test: str, *, serial: bool) -> None:
        self.test = test
        self.serial = serial
        self._directory = lock_dir()
        self._held = ExitStack()

    def __enter__(self) -> Turn:
        self._take(exclusive=False)
        return self

    def call(self) -> None:
        """Before the test's call: a `serial` test gives back its shared hold and waits
        for the run alone."""
        if self.serial:
            self._held.close()
            self._take(exclusive=True)

    def teardown(self) -> None:
        """As the test's teardown starts: a `serial` test lets the others run."""
        if self.serial:
            self._held.close()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._held.close()

    def _take(self, *, exclusive: bool) -> None:
        if self._directory is None:
            return
        turnstile, running = self._directory / "turnstile", self._directory / "running"
        asked = time.monotonic()
        if exclusive:  # the turnstile kept: no other test starts until this one ends
            self._held.enter_context(_locked(turnstile, fcntl.LOCK_EX))
            self._held.enter_context(_locked(running, fcntl.LOCK_EX))
        else:
            with _locked(turnstile, fcntl.LOCK_EX):
                self._held.enter_context(_locked(running, fcntl.LOCK_SH))
        waited = time.monotonic() - asked
        WAITED_S["serial" if exclusive else "other"] += waited
        if waited > 1.0:
            LONG_WAITS.append((waited, self.test))
