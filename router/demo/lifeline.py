"""What keeps the demo from leaving anything behind when it is killed outright.

Every child the demo starts (simulators, gateway replicas, Redis) asks Linux to SIGKILL it
the moment its parent dies (`PR_SET_PDEATHSIG`, set between fork and exec), so even a
`kill -9` of the demo takes every child with it. A directory the demo could not remove
(it was killed) carries the demo's pid in its name and is removed by the next demo once
that pid is gone.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1
DIR_PREFIXES = ("pd-gateway-demo-", "pd-gateway-redis-")
_STALE = re.compile(r"^(?:pd-gateway-demo|pd-gateway-redis)-(\d+)-")


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child die with this process (None off Linux).

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
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return preexec


def dir_prefix(kind: str) -> str:
    """`pd-gateway-<kind>-<pid>-`: a temporary directory's prefix naming its owner."""
    return f"pd-gateway-{kind}-{os.getpid()}-"


def remove_stale_dirs(root: Path | None = None) -> list[Path]:
    """Remove the temporary directories of demos that are no longer running."""
    base = Path(root or tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(base.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _STALE.match(entry.name)
        if match is None or not entry.is_dir() or _running(int(match.group(1))):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
