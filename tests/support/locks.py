"""The container image's locks (deploy/requirements.lock, deploy/build.lock) read as pins:
what the image installs, for the tests that check the locks and for the Python 3.13 test
environment, which installs the same versions so that the suite runs what the image runs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_LOCK = ROOT / "deploy" / "requirements.lock"
BUILD_LOCK = ROOT / "deploy" / "build.lock"

_PIN = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)\s*(?:;\s*(?P<marker>[^\\]+?))?\s*\\?$"
)
_SEPARATORS = re.compile(r"[-_.]+")


def canonicalize_name(name: str) -> str:
    """PEP 503's normal form of a distribution's name (standard library only: the test
    environment's installer reads the lock before anything is installed)."""
    return _SEPARATORS.sub("-", name).lower()


_HASH = re.compile(r"^\s+--hash=(?P<hash>sha256:[0-9a-f]{64})\s*\\?$")


@dataclass(frozen=True)
class Pin:
    name: str
    """Canonical (PEP 503) name."""
    version: str
    marker: str | None
    hashes: tuple[str, ...]

    @property
    def constraint(self) -> str:
        """`name==version` (and its marker), without hashes: pip takes hashes in a
        constraints file as asking every requirement to have them."""
        return f"{self.name}=={self.version}" + (f" ; {self.marker}" if self.marker else "")


def read_lock(path: Path) -> dict[str, Pin]:
    """The pins of a lock as `uv pip compile --generate-hashes` writes it; a line it cannot
    read is an error, not skipped."""
    pins: dict[str, Pin] = {}
    current: tuple[str, str, str | None] | None = None
    hashes: list[str] = []

    def close() -> None:
        if current is not None:
            name, version, marker = current
            pins[name] = Pin(name, version, marker, tuple(hashes))

    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if pin := _PIN.match(line):
            close()
            current = (canonicalize_name(pin["name"]), pin["version"], pin["marker"])
            hashes = []
        elif (digest := _HASH.match(line)) and current is not None:
            hashes.append(digest["hash"])
        else:
            raise ValueError(f"{path}:{number}: not a pin or a hash: {line!r}")
    close()
    return pins


def constraints(path: Path = RUNTIME_LOCK) -> str:
    """The lock's pins as a pip constraints file."""
    return "".join(pin.constraint + "\n" for pin in read_lock(path).values())
