"""Installs TileRT's own decode node, releases 0.1.5 and 0.1.6 from PyPI, into
`.venv-tilert/` beside the project, for the `real_tilert` test tier:

    python -m tests.real_tilert.install

Does nothing when what it makes is already there. TileRT publishes wheels for CPython 3.12
only (`cp312`), while its `Requires-Python` is `>=3.11` and the code the tier runs
(`tilert/pd_vllm/`) is plain Python: the `libtilert_*.so` in the wheels are CUDA libraries
that TileRT loads with ctypes for a real engine, not extension modules. No Python 3.12 can
be had on this machine's kind (Debian's archive has 3.11 and 3.13), and pip refuses a cp312
wheel for another Python, so the wheels are unpacked here instead, each release into a
folder of its own (`.venv-tilert/releases/<release>/`, dist-info included) that the tier
puts on the node's `PYTHONPATH`; both share one environment of the Python 3.11 that runs
this script (the project's), holding what the decode server imports (`requirements.txt`,
every package at a fixed release, `--no-deps`), torch's CPU build from this machine's disk
among them. Each wheel's sha256 is checked against the one PyPI's JSON API names for it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import venv
import zipfile
from pathlib import Path

from tests.support import installer

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-tilert"
PYTHON = VENV / "bin" / "python"
RELEASES_DIR = VENV / "releases"
REQUIREMENTS = Path(__file__).with_name("requirements.txt")
STAMP = VENV / ".installed-from"  # the pins the environment was installed from
PYPI_PROJECT = "https://pypi.org/pypi/tilert/json"

RELEASES = {"0.1.5": "0.1.5.post2", "0.1.6": "0.1.6.post3"}
"""The TileRT release the gateway names (`latency.tilert`) -> the PyPI release the tier runs.
0.1.5.post2 is the last 0.1.5 whose node streams as docs/protocols.md §1.5 describes (lines
as tokens arrive); 0.1.5.post3 batches its lines as 0.1.6 does (docs/conformance.md)."""
WHEEL_TAGS = "cp312-cp312-manylinux_2_28_x86_64"


class Unavailable(Exception):
    """Something the install needs could not be fetched or checked."""


def release_dir(release: str) -> Path:
    """Where TileRT `release` (0.1.5 or 0.1.6) is unpacked: the node's `PYTHONPATH`."""
    return RELEASES_DIR / release


def unpacked_version(release: str) -> str | None:
    """The PyPI release unpacked for `release`, from its dist-info; None if none is."""
    found = sorted(release_dir(release).glob("tilert-*.dist-info/METADATA"))
    if not found:
        return None
    for line in found[0].read_text(encoding="utf-8").splitlines():
        if line.startswith("Version: "):
            return line.removeprefix("Version: ").strip()
    return None


def environment_ready() -> bool:
    return PYTHON.exists() and STAMP.exists() and STAMP.read_text() == _requirements_digest()


def ready() -> bool:
    """Whether the environment and every pinned release are in place."""
    return environment_ready() and all(
        unpacked_version(release) == pinned for release, pinned in RELEASES.items()
    )


def install() -> None:
    try:
        if not environment_ready():
            print(f"making {VENV} (torch {_torch_pin()}, fastapi, uvicorn)")
            venv.create(VENV, with_pip=False, clear=True)
            installer.install(PYTHON, ["--no-deps", "-r", str(REQUIREMENTS)], compiled=False)
            STAMP.write_text(_requirements_digest())
        for release, pinned in RELEASES.items():
            if unpacked_version(release) != pinned:
                _unpack(release, pinned)
        _smoke_test()
    except (Unavailable, installer.InstallFailed, subprocess.CalledProcessError) as failure:
        sys.exit(f"TileRT install failed: {failure}")
    print(f"TileRT {', '.join(RELEASES.values())} ready in {VENV}")


def _unpack(release: str, pinned: str) -> None:
    wheel_name = f"tilert-{pinned}-{WHEEL_TAGS}.whl"
    wanted = _pypi_sha256(pinned, wheel_name)
    with tempfile.TemporaryDirectory() as download:
        print(f"downloading {wheel_name}")
        command = [
            *(sys.executable, "-m", "pip", "download", "-q", "--no-deps"),
            *("--only-binary=:all:", "--python-version", "3.12"),
            *("--platform", "manylinux_2_28_x86_64", "-d", download, f"tilert=={pinned}"),
        ]
        fetched = subprocess.run(command, capture_output=True, text=True)
        wheel = Path(download) / wheel_name
        if fetched.returncode != 0 or not wheel.exists():
            reason = (fetched.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise Unavailable(f"pip download tilert=={pinned} failed: {reason}")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != wanted:
            raise Unavailable(f"{wheel_name}: sha256 {digest}, PyPI names {wanted}")
        target = release_dir(release)
        shutil.rmtree(target, ignore_errors=True)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target)
    print(f"TileRT {pinned} unpacked in {target}")


def _pypi_sha256(pinned: str, wheel_name: str) -> str:
    try:
        with urllib.request.urlopen(PYPI_PROJECT, timeout=60) as response:
            project = json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as failure:
        raise Unavailable(f"cannot read {PYPI_PROJECT}: {failure}") from failure
    for file in project.get("releases", {}).get(pinned, []):
        if file.get("filename") == wheel_name:
            return str(file["digests"]["sha256"])
    raise Unavailable(f"PyPI lists no {wheel_name}")


def _smoke_test() -> None:
    """Each release's decode server imports on the environment's Python."""
    for release in RELEASES:
        probe = subprocess.run(
            [str(PYTHON), "-c", "import tilert.pd_vllm.decode_server"],
            capture_output=True,
            text=True,
            env={**installer.WRITES_BYTECODE, "PYTHONPATH": str(release_dir(release))},
        )
        if probe.returncode != 0:
            raise Unavailable(f"TileRT {release} does not import:\n{probe.stderr[-2000:]}")


def _requirements_digest() -> str:
    """Of the pinned packages alone: a changed comment reinstalls nothing."""
    lines = REQUIREMENTS.read_text().splitlines()
    pins = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return hashlib.sha256("\n".join(pins).encode()).hexdigest()


def _torch_pin() -> str:
    for line in REQUIREMENTS.read_text().splitlines():
        if line.startswith("torch=="):
            return line.removeprefix("torch==")
    return "?"


if __name__ == "__main__":
    install()
