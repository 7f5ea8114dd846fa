"""Suite-wide test set-up: the `e2e` marker.

A test is `e2e` when it starts real processes (simulators, the gateway, the CLI): every
test under tests/e2e/ is marked here, other modules mark themselves (`pytestmark`).
`pytest -m "not e2e"` is then the fast in-process loop, and a test that starts a process
without the marker fails at once, so nothing slow slips into that loop unnoticed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

E2E_DIR = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(E2E_DIR):
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Outside `e2e` tests (their fixtures included), starting a process is an error."""
    if item.get_closest_marker("e2e") is not None:
        return (yield)
    with processes_refused(item.nodeid):
        return (yield)


class UnmarkedProcessError(AssertionError):
    """A test without the `e2e` marker tried to start a process."""


@contextmanager
def processes_refused(nodeid: str) -> Iterator[None]:
    original = subprocess.Popen.__init__

    def refuse(popen: subprocess.Popen[Any], args: Any, *more: Any, **options: Any) -> None:
        raise UnmarkedProcessError(
            f"{nodeid} starts a process ({args!r}) without the e2e marker: "
            "mark it (or its module: `pytestmark = pytest.mark.e2e`)"
        )

    subprocess.Popen.__init__ = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = original  # type: ignore[method-assign]
