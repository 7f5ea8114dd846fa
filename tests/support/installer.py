"""Installs packages into a Python environment with uv (`uv pip install`), which fetches and
unpacks in parallel: real vLLM's 157 pinned packages took pip 118 s and take uv about 50
on these machines, cold. Every install of `python -m tests.prepare` goes through here.

    python -m tests.support.installer                 # puts uv in the running environment
    python -m tests.support.installer -e '.[test]'    # and installs into it with uv

uv comes from its PyPI wheel, installed by the running interpreter's pip when it is not
there yet (`tests.prepare` does it once, as a step the others wait for: two pips
installing it into one environment at once would race). uv reads settings of its own, not
pip's, so the ones a machine gives pip in its environment (`PIP_INDEX_URL`,
`PIP_EXTRA_INDEX_URL`, `PIP_FIND_LINKS`: e.g. where the CPU build of torch is) are passed
on. What is installed is compiled to bytecode, as pip does: where PYTHONDONTWRITEBYTECODE
is set (CI), nothing compiled on import is kept, and every process would compile again.
Except where few processes run and they import a small part of what is installed: vLLM's
and TileRT's environments (torch, vLLM, transformers) hold some 20,000 modules, 52 and 22 s
of CPU to compile, and a vLLM server imports 5,000 of them. `compiled=False` leaves those
as source, and those processes run with `WRITES_BYTECODE` in their environment, so that each
module they import is compiled once, by the first of them, and kept (16 s of CPU on the
first vLLM server's start).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

UV_REQUIREMENT = "uv>=0.9"
WRITES_BYTECODE = {"PYTHONDONTWRITEBYTECODE": ""}
"""For a process on an environment installed `compiled=False`: what it compiles on import
is kept, wherever PYTHONDONTWRITEBYTECODE is set (empty is unset)."""
PIP_SETTINGS = {  # pip's environment variable: uv's option
    "PIP_INDEX_URL": "--index-url",
    "PIP_EXTRA_INDEX_URL": "--extra-index-url",
    "PIP_FIND_LINKS": "--find-links",
}


class InstallFailed(Exception):
    """An install that did not complete, with the command's last words."""


def uv() -> str:
    """The uv executable, installed into the running environment first if need be."""
    try:
        return _find_uv()
    except (ImportError, FileNotFoundError):
        pip = [sys.executable, "-m", "pip", "install", "-q", UV_REQUIREMENT]
        if subprocess.run(pip).returncode != 0:
            raise InstallFailed(f"pip install {UV_REQUIREMENT} failed") from None
        importlib.invalidate_caches()
        return _find_uv()


def install(
    python: Path | str,
    requirements: Sequence[str],
    *,
    target: Path | None = None,
    compiled: bool = True,
) -> None:
    """`uv pip install` of `requirements` (names, pins, `-r FILE`, `-e DIR`, options such as
    `--no-deps`) for the interpreter `python`; into `target` alone when given; compiled to
    bytecode unless `compiled` is False."""
    command = [uv(), "pip", "install", "--quiet"]
    if compiled:
        command.append("--compile-bytecode")
    command += ["--python", str(python)]
    if target is not None:
        command += ["--target", str(target)]
    for variable, option in PIP_SETTINGS.items():
        for value in os.environ.get(variable, "").split():
            command += [option, value]
    if os.environ.get("PIP_EXTRA_INDEX_URL", "").strip():
        # Each package from whichever index has the release asked for, as pip does (uv's
        # own way takes the first index that has the package at all: torch's index holds
        # some of PyPI's packages, at other releases).
        command += ["--index-strategy", "unsafe-best-match"]
    done = subprocess.run([*command, *requirements], capture_output=True, text=True)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()
        raise InstallFailed(f"uv pip install {' '.join(requirements)}: {' / '.join(said[-5:])}")


def _find_uv() -> str:
    module = importlib.import_module("uv")
    path: str = module.find_uv_bin()
    return path


def main(arguments: Sequence[str]) -> int:
    try:
        if arguments:
            install(sys.executable, arguments)
        else:
            print(f"uv is ready: {uv()}")
    except InstallFailed as failure:
        print(failure, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
