"""The Python every test that starts the gateway as a process runs it on (`pd-gateway
serve`, `demo`, `bench` and the other commands, through `python -m router.cli`).

The container image runs the gateway on Python 3.13, so the tests do too where
`.venv-3.13/` is there (`python -m tests.prepare` makes it); in-process tests run on the
Python running pytest. `PD_GATEWAY_PYTHON` names another interpreter (one with the
project and its dependencies installed). Without either, the gateway runs on pytest's own
Python, so a checkout without 3.13 still gets a whole run; the run's header says which.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

from tests.newer_python.install import VENV

OVERRIDE = "PD_GATEWAY_PYTHON"


def gateway_python() -> str:
    """The interpreter to start gateway processes with."""
    named = os.environ.get(OVERRIDE)
    if named:
        return named
    image = VENV / "bin" / "python"
    return str(image) if image.exists() else sys.executable


@functools.cache
def gateway_python_version() -> str:
    """The release of `gateway_python()` ("3.13.5"), as it reports it."""
    done = subprocess.run(
        [gateway_python(), "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{gateway_python()} does not run: {done.stderr.strip()}")
    return done.stdout.strip()


def report_header() -> str:
    """The line the run's header gives it."""
    python = gateway_python()
    if python == sys.executable:
        where = "this Python (no .venv-3.13: `python -m tests.prepare` makes it)"
    else:
        where = python + (f" (from {OVERRIDE})" if os.environ.get(OVERRIDE) else "")
    return f"gateway processes: Python {gateway_python_version()}, {where}"


def gateway_python_has(module: str) -> bool:
    """Whether `gateway_python()` can import `module` (an optional dependency)."""
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([gateway_python(), "-c", probe], timeout=60).returncode == 0
