"""Installs everything the test suite needs beside the project's own environment, the
steps side by side (none needs another; each is mostly waiting on downloads):

    python -m tests.install

* `vllm`: real vLLM in `.venv-vllm/` (`python -m tests.real_vllm.install`);
* `promtool`: Prometheus's rule checker in `.promtool/` (`python -m tests.deploy.promtool`);
* `python3.13`: the container image's Python and the project in `.venv-3.13/`, which the
  tests run the gateway's processes on (`python -m tests.newer_python.install`).

Each line a step prints comes prefixed with its name, and each step's time at its end;
the exit status is 1 if any failed, with the name of each step that did. Every step is
also a command of its own, and does nothing when what it makes is already there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
STEPS = {
    "vllm": [sys.executable, "-m", "tests.real_vllm.install"],
    "promtool": [sys.executable, "-m", "tests.deploy.promtool"],
    "python3.13": [sys.executable, "-m", "tests.newer_python.install"],
}


@dataclass
class Step:
    name: str
    command: list[str]
    prefix: str
    code: int | None = None


def run_steps(steps: dict[str, list[str]], out: IO[str] = sys.stdout) -> list[str]:
    """Run every step's command at once; the names of those that failed, in `steps`' order."""
    printing = threading.Lock()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    started = time.monotonic()
    threads = []
    width = max(map(len, steps))
    done = [Step(name, command, f"[{name:<{width}}] ") for name, command in steps.items()]
    for step in done:
        popen = subprocess.Popen(
            step.command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            cwd=ROOT,
            env=env,
        )
        thread = threading.Thread(target=_relay, args=(step, popen, printing, out, started))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return [step.name for step in done if step.code != 0]


def _relay(
    step: Step,
    popen: subprocess.Popen[str],
    printing: threading.Lock,
    out: IO[str],
    started: float,
) -> None:
    """Echo a step's output, each line prefixed with its name; note how it ended."""
    assert popen.stdout is not None
    with popen.stdout:
        for line in popen.stdout:
            with printing:
                out.write(step.prefix + line)
                out.flush()
    step.code = popen.wait()
    outcome = "done" if step.code == 0 else f"failed (exit status {step.code})"
    with printing:
        out.write(f"{step.prefix}{outcome} after {time.monotonic() - started:.0f} s\n")
        out.flush()


def main() -> int:
    failed = run_steps(STEPS)
    if failed:
        print(f"error: the install failed at: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
