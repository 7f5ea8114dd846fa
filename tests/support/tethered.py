"""Runs a command as the leader of its own process group, tied to the process that started
it: `subprocess.Popen(tethered(command, grace_s), start_new_session=True,
preexec_fn=tether())`.

A SIGTERM, whether sent to stop the command or delivered by Linux because the starter died
(even by `kill -9`), takes the whole group down: SIGTERM to every process in it, then
SIGKILL to what is left after `grace_s`. When the command exits on its own, the rest of the
group gets a SIGTERM. vLLM's engine processes outlive a killed API server, so an aborted
test run would otherwise leave gigabytes of them behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from types import FrameType

from router.process.lifeline import die_with_parent


def tethered(command: list[str], grace_s: float) -> list[str]:
    """The command line running `command` under this module, as a script: `-P` keeps this
    folder (whose `http.py` would hide the standard library's) off its import path."""
    return [sys.executable, "-P", __file__, str(grace_s), *command]


def tether() -> Callable[[], None] | None:
    """The `preexec_fn` for this module's process: a SIGTERM when the starter dies."""
    return die_with_parent(signal.SIGTERM)


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def main(argv: list[str]) -> int:
    grace_s, command = float(argv[0]), argv[1:]
    signal.signal(signal.SIGTERM, _raise_stop)
    child: subprocess.Popen[bytes] | None = None
    try:
        child = subprocess.Popen(command)
        code = child.wait()
    except _Stop:
        code = None
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # this process is in the group it signals
    os.killpg(0, signal.SIGTERM)
    if code is not None:  # the command ended on its own: what is left has its SIGTERM
        return code
    if child is not None:
        try:
            child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    os.killpg(0, signal.SIGKILL)  # ends this process too, with whatever is left
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
