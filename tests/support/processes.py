"""Processes the tests start, each the leader of a process group of its own and stopped
with its whole group however the test ends: passed, failed, an exception while starting,
or a timeout (pytest-timeout's raises in the test; `subprocess.run`'s own kills the leader
alone, so commands that may start others run through `run_in_group` instead).

A process group is what one `os.killpg` reaches: a child that starts a session of its own
(the demo's simulators and gateway) is not in it, and has to die with its parent instead.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

STOP_GRACE_S = 15.0  # a gateway drains in-flight requests on SIGTERM
GONE_WITHIN_S = 10.0  # SIGKILLed processes are gone once the kernel has torn them down


def running(pid: int) -> bool:
    """Whether `pid` is a live process: a zombie (dead, not yet reaped by whoever adopted
    it) is not, nor one that ends while its /proc entry is read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # no such entry, or no such process by the time it is read
        return False
    return fields[0] != "Z"


def group_members(pgid: int) -> list[int]:
    """Every live process (zombies aside) of process group `pgid`, found through /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # nobody left in it


def stop_group(
    popen: subprocess.Popen[Any], *, sig: int = signal.SIGTERM, grace_s: float = STOP_GRACE_S
) -> None:
    """`sig` to `popen`'s group while its leader runs, SIGKILL to whatever of the group is
    left after `grace_s` (or once the leader has exited); return when none of it is alive.
    The leader must have been started with `start_new_session=True`."""
    pgid = popen.pid
    if popen.poll() is None and sig != signal.SIGKILL:
        signal_group(pgid, sig)
        signal_group(pgid, signal.SIGCONT)  # a paused group must run to handle it
        try:
            popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    # The leader gone, the number stays the group's while any member lives: no other
    # process can be reached by it.
    signal_group(pgid, signal.SIGKILL)
    popen.wait()
    deadline = time.monotonic() + GONE_WITHIN_S
    while left := group_members(pgid):
        if time.monotonic() > deadline:
            raise AssertionError(f"processes {left} of group {pgid} outlived SIGKILL")
        time.sleep(0.02)  # the kernel tearing down what it has killed: no event to wait on


@contextmanager
def process_group(
    popen: subprocess.Popen[Any], *, sig: int = signal.SIGTERM, grace_s: float = STOP_GRACE_S
) -> Iterator[subprocess.Popen[Any]]:
    """`popen` (a group leader) for the block; its whole group is stopped when the block
    ends, whatever ends it."""
    try:
        yield popen
    finally:
        stop_group(popen, sig=sig, grace_s=grace_s)


def run_in_group(
    argv: Sequence[str], *, timeout_s: float, stdout: Any = subprocess.PIPE, **options: Any
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)` (or
    `stdout` elsewhere), the command the leader of a group of its own: on a timeout, and
    once it has exited, nothing of its group is left running."""
    popen = subprocess.Popen(
        list(argv),
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **options,
    )
    with process_group(popen, sig=signal.SIGKILL):
        try:
            out, err = popen.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(popen, sig=signal.SIGKILL)
            popen.communicate()  # what it wrote, and its pipes closed
            raise
    return subprocess.CompletedProcess(popen.args, popen.returncode, out, err)


def ready_line(proc: subprocess.Popen[str], prefix: str, deadline: float) -> str | None:
    """What follows `prefix` in the first line of `proc`'s standard output that starts with
    it (read on a thread of its own, to the end of the output); None if the process exits or
    `deadline` (time.monotonic()) passes first."""
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            if proc.poll() is not None:
                return None
            continue
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    return None


def _pump(stream: IO[str], out: queue.Queue[str]) -> None:
    with stream:  # closed at the end of the output, once the process has gone
        for line in stream:
            out.put(line)
