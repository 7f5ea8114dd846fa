"""A process a test starts is stopped with its whole process group however the test ends
(tests.support.processes): the test fails, its fixture's set-up raises, it times out, or
the command it runs outlasts its time. A real pytest run of a small test file, with real
processes: each a shell and a child of its own, both in the shell's group."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.support.processes import run_in_group, running

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
# Appends "shell child" pids to the file named by $PIDS, then waits on its child.
FAMILY = 'sleep 600 & echo $$ $! >> "$PIDS"; wait'

INNER = f"""
import os, subprocess, time

import pytest

from tests.support.processes import process_group, run_in_group

FAMILY = {FAMILY!r}


def family_started():
    before = len(open(os.environ["PIDS"]).read().splitlines())
    proc = subprocess.Popen(
        ["sh", "-c", FAMILY], stdout=subprocess.DEVNULL, start_new_session=True
    )
    # The shell writes its line once it has started its child.
    deadline = time.monotonic() + 20
    while len(open(os.environ["PIDS"]).read().splitlines()) == before:
        assert time.monotonic() < deadline, "the family never started"
        time.sleep(0.01)
    return proc


@pytest.fixture
def family():
    with process_group(family_started()) as proc:
        yield proc


@pytest.fixture
def broken_setup():
    with process_group(family_started()):
        raise RuntimeError("set-up failed after starting a process")
    yield


def test_a_failing_test(family):
    assert False, "the test fails"


def test_a_set_up_that_raises(broken_setup):
    pass


@pytest.mark.timeout(1)
def test_a_test_that_times_out(family):
    time.sleep(60)


def test_a_command_that_outlasts_its_time():
    run_in_group(["sh", "-c", FAMILY], timeout_s=1)
"""


def test_no_process_of_a_group_outlives_its_test_however_it_ends(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    pids_file = tmp_path / "pids"
    pids_file.touch()
    env = {**os.environ, "PIDS": str(pids_file), "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_ADDOPTS", None)  # the options of the run around this one are not its own
    done = run_in_group(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q"],
        cwd=tmp_path,
        env=env,
        timeout_s=120,
    )
    summary = done.stdout.splitlines()[-1]
    assert "3 failed" in summary and "1 error" in summary, done.stdout[-3000:]
    assert "Timeout" in done.stdout and "set-up failed" in done.stdout
    families = [line.split() for line in pids_file.read_text().splitlines()]
    assert len(families) == 4  # one per test, each a shell and its child
    pids = [int(pid) for family in families for pid in family]
    assert [pid for pid in pids if running(pid)] == []
