"""A `serial` test sets up beside the others, holds the run alone for its call
(tests.support.serial) and lets go as its teardown starts; other tests share the run."""

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


def test_a_serial_test_holds_the_run_alone_from_its_call_to_its_teardown(
    run_directory: Path,
) -> None:
    with serial.Turn("tests/test_x.py::test_timed", serial=True) as turn:
        assert others_may_run(run_directory)  # its set-up
        turn.call()
        assert not others_may_run(run_directory)
        turn.teardown()
        assert others_may_run(run_directory)
    assert others_may_run(run_directory)


def test_a_serial_call_waits_for_the_tests_running_beside_it(run_directory: Path) -> None:
    with serial.Turn("tests/test_x.py::test_one", serial=False):
        fd = os.open(run_directory / "running", os.O_RDWR)
        try:  # what the serial test's call asks for, without waiting
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


def test_other_tests_share_the_run(run_directory: Path) -> None:
    with serial.Turn("tests/test_x.py::test_one", serial=False) as turn:
        turn.call()
        assert others_may_run(run_directory)
        turn.teardown()
        assert others_may_run(run_directory)
