"""What keeps the demo from leaving anything behind when it is killed outright.

Every child the demo starts (simulators, gateway replicas, Redis) dies with it
(`router.process.lifeline.die_with_parent`), so even a `kill -9` of the demo takes every child
with it. A directory the demo could not remove
(it was killed) carries the demo's pid in its name and is removed by the next demo once
that pid is gone.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

DIR_PREFIXES = ("pd-gateway-demo-", "pd-gateway-redis-")
_STALE = re.compile(r"^(?:pd-gateway-demo|pd-gateway-redis)-(\d+)-")


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
