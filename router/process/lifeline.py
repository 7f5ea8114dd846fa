"""Children that die with their parent: Linux's `PR_SET_PDEATHSIG`, so that even a
`kill -9` of a parent (the demo, the benchmarks, the supervisor of the gateway's workers)
leaves no process of its own behind."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child die with this process (None off Linux): it gets
    `signum` when this process ends.

    Linux ties the request to the thread that forks, so it is made only from the main
    thread: a child started from a worker thread would die when that thread ends.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not (
        threading.main_thread()
    ):
        return None
    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return preexec
