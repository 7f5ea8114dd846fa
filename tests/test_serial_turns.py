"""A `serial` test holds the run alone (tests.support.serial) until it lets go, which its
teardown does; other tests share the run."""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

import pytest

from tests.support import serial


def others_may_run(directory: Path) -> bool:
    """Whether another test could take its shared turn now (without waiting)."""
    fd = os.open(directory / "running", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


@pytest.fixture
def run_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "unit")
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    directory = serial.lock_dir()
    assert directory is not None
    return directory


def test_a_serial_test_holds_the_run_until_it_lets_go(run_directory: Path) -> None:
    with serial.turn(True, "tests/test_x.py::test_timed") as let_go:
        assert not others_may_run(run_directory)
        let_go()  # its teardown
        assert others_may_run(run_directory)
    assert others_may_run(run_directory)


def test_other_tests_share_the_run(run_directory: Path) -> None:
    with serial.turn(False, "tests/test_x.py::test_one"):
        assert others_may_run(run_directory)
