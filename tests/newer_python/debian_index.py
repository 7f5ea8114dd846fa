"""Debian's package index, read to pick the packages of an interpreter: the stanzas of a
`Packages` file, the closure of a package's dependencies over them, and a downloaded
package held to the checksum the index gives. Pure: no network, no files."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass


class PackageIndexError(Exception):
    """The index does not hold what is asked of it, or a package is not what it says."""


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    filename: str  # the .deb's path below the archive's root
    sha256: str
    depends: tuple[tuple[str, ...], ...]  # each group: alternatives, the first preferred
    provides: tuple[str, ...]


def parse_index(text: str) -> dict[str, Package]:
    """Every package of a `Packages` file, by name."""
    packages: dict[str, Package] = {}
    for stanza in text.split("\n\n"):
        fields = _fields(stanza)
        if "Package" not in fields:
            continue
        package = Package(
            name=fields["Package"],
            version=fields.get("Version", ""),
            filename=fields.get("Filename", ""),
            sha256=fields.get("SHA256", ""),
            depends=tuple(
                _groups(fields.get("Pre-Depends", "")) + _groups(fields.get("Depends", ""))
            ),
            provides=tuple(_names(fields.get("Provides", ""))),
        )
        packages.setdefault(package.name, package)
    return packages


def closure(
    index: dict[str, Package], wanted: Iterable[str], leave_out: Iterable[str] = ()
) -> list[Package]:
    """`wanted` and everything it depends on, in the order met. A dependency group with a
    left-out alternative is left out whole (data packages the host already has, or that
    only a package manager needs)."""
    left_out = set(leave_out)
    providers: dict[str, str] = {}
    for package in index.values():
        for virtual in package.provides:
            providers.setdefault(virtual, package.name)
    chosen: dict[str, Package] = {}
    queue = list(wanted)
    while queue:
        name = queue.pop(0)
        if name in chosen:
            continue
        if name not in index:
            raise PackageIndexError(f"{name} is not in the package index")
        package = index[name]
        chosen[name] = package
        for group in package.depends:
            if left_out.intersection(group):
                continue
            queue.append(_pick(group, index, providers, needed_by=name))
    return list(chosen.values())


def check_sha256(package: Package, content: bytes) -> None:
    digest = hashlib.sha256(content).hexdigest()
    if digest != package.sha256:
        raise PackageIndexError(
            f"{package.filename}: sha256 {digest}, the index says {package.sha256}"
        )


def _pick(
    group: tuple[str, ...], index: dict[str, Package], providers: dict[str, str], needed_by: str
) -> str:
    for name in group:
        if name in index:
            return name
    for name in group:
        if name in providers:
            return providers[name]
    raise PackageIndexError(f"{needed_by} needs {' | '.join(group)}, which the index does not hold")


def _fields(stanza: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in stanza.splitlines():
        if not line or line[0].isspace():
            continue  # a continuation line: only multi-line descriptions have them here
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def _groups(relations: str) -> list[tuple[str, ...]]:
    return [
        tuple(_names(group.replace("|", ","))) for group in relations.split(",") if group.strip()
    ]


def _names(relations: str) -> list[str]:
    """Package names of a relation field, versions and architecture qualifiers dropped."""
    names = []
    for relation in relations.split(","):
        name = relation.strip().split(" ")[0].split("(")[0].split(":")[0]
        if name:
            names.append(name)
    return names
