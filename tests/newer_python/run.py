"""Runs the test suite on Python 3.13, in the environment `tests.newer_python.install`
made; arguments are pytest's:

    python -m tests.newer_python.run [pytest arguments]
"""

from __future__ import annotations

import subprocess
import sys

from tests.newer_python.install import ROOT, VENV


def run(arguments: list[str]) -> int:
    python = VENV / "bin" / "python"
    if not python.exists():
        sys.exit(f"{VENV} is missing: run python -m tests.newer_python.install first")
    return subprocess.run([str(python), "-m", "pytest", "-q", *arguments], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
