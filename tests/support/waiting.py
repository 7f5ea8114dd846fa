"""Polling a condition that another process makes true (tests only)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    condition: Callable[[], bool], *, what: str = "a condition", timeout_s: float = 20.0
) -> None:
    """Return once `condition()` holds; fail, naming `what`, after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.02)
