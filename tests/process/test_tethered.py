"""The tether that real vLLM servers run under in tests: whatever ends it (a stop, the
death of the process that started it, the command's own exit), nothing of the command's
process group is left running. Real processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import running
from tests.support.tethered import tether, tethered
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
# A shell and a child of its own, each printing its pid: the child stands for vLLM's
# engine processes, which outlive the API server they belong to.
FAMILY = "sleep 600 & echo $$ $!; wait"
STUBBORN = 'trap "" TERM; ' + FAMILY  # ignores SIGTERM, as does its child


def family_pids(proc: subprocess.Popen[str]) -> list[int]:
    assert proc.stdout is not None
    return [int(pid) for pid in proc.stdout.readline().split()]


def start(script: str, grace_s: float = 30.0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        tethered(["sh", "-c", script], grace_s),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=tether(),
    )


def test_a_killed_starter_takes_the_whole_group_along() -> None:
    starter_code = (
        "import subprocess, sys, time\n"
        "from tests.support.tethered import tether, tethered\n"
        f"subprocess.Popen(tethered(['sh', '-c', {FAMILY!r}], 30.0),"
        " start_new_session=True, preexec_fn=tether())\n"
        "time.sleep(600)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", starter_code], stdout=subprocess.PIPE, text=True, cwd=ROOT
    ) as starter:
        pids = family_pids(starter)
        assert len(pids) == 2 and all(map(running, pids))
        starter.kill()
    wait_until(lambda: not any(map(running, pids)), what="the shell and its child to end")


def test_a_stop_ends_what_ignores_sigterm_after_the_grace() -> None:
    with start(STUBBORN, grace_s=0.5) as proc:
        pids = family_pids(proc)
        proc.terminate()
        assert proc.wait(timeout=20) == -signal.SIGKILL  # the tether's last act
    wait_until(lambda: not any(map(running, pids)), what="the shell and its child to end")


def test_a_stop_within_the_grace_ends_everything() -> None:
    with start(FAMILY) as proc:
        pids = family_pids(proc)
        proc.terminate()
        proc.wait(timeout=20)  # well inside the 30 s grace: the group ended on SIGTERM
    wait_until(lambda: not any(map(running, pids)), what="the shell and its child to end")


def test_a_command_that_ends_on_its_own_gives_its_code_and_leaves_nothing() -> None:
    with start("sleep 600 & echo $$ $!; exit 3") as proc:
        pids = family_pids(proc)
        assert proc.wait(timeout=20) == 3
    wait_until(lambda: not any(map(running, pids)), what="the shell's child to end")
    assert os.getpgid(os.getpid()) != proc.pid  # the group signalled was never this one
