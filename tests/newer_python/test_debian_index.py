"""The installer's reading of Debian's package index: stanzas, the dependency closure, the
checksum."""

from __future__ import annotations

import hashlib
import re

import pytest

from tests.newer_python.debian_index import (
    PackageIndexError,
    check_sha256,
    closure,
    parse_index,
)

INDEX = """\
Package: python3.13
Version: 3.13.5-2
Installed-Size: 100
Depends: python3.13-minimal (= 3.13.5-2), libpython3.13-stdlib, media-types | mime-support, tzdata
Description: an interactive high-level object-oriented language
 Python is an interpreted, interactive, object-oriented programming
 language. Depends: not-a-field (continuation lines are description).
Filename: pool/main/p/python3.13/python3.13_3.13.5-2_amd64.deb
SHA256: 00aa

Package: python3.13-minimal
Version: 3.13.5-2
Pre-Depends: libc6 (>= 2.38)
Depends: libexpat1 (>= 2.6.0), zlib1g (>= 1:1.2.0)
Filename: pool/main/p/python3.13/python3.13-minimal_3.13.5-2_amd64.deb
SHA256: 11bb

Package: libpython3.13-stdlib
Version: 3.13.5-2
Depends: libpython3.13-minimal (= 3.13.5-2), libdb5.3 | libgdbm-compat, libssl3t64:any (>= 3.4.0)
Filename: pool/main/p/python3.13/libpython3.13-stdlib_3.13.5-2_amd64.deb
SHA256: 22cc

Package: libpython3.13-minimal
Version: 3.13.5-2
Depends: libc6 (>= 2.14)
Filename: pool/main/p/python3.13/libpython3.13-minimal_3.13.5-2_amd64.deb
SHA256: 33dd

Package: libc6
Version: 2.41-12
Filename: pool/main/g/glibc/libc6_2.41-12_amd64.deb
SHA256: 44ee

Package: libexpat1
Version: 2.7.1-2
Filename: pool/main/e/expat/libexpat1_2.7.1-2_amd64.deb
SHA256: 55ff

Package: zlib1g
Version: 1:1.3.1-1
Filename: pool/main/z/zlib/zlib1g_1.3.1-1_amd64.deb
SHA256: 6600

Package: libdb5.3t64
Version: 5.3.28-9
Provides: libdb5.3
Filename: pool/main/d/db5.3/libdb5.3t64_5.3.28-9_amd64.deb
SHA256: 7711

Package: libssl3t64
Version: 3.5.1-1
Depends: libc6 (>= 2.38)
Filename: pool/main/o/openssl/libssl3t64_3.5.1-1_amd64.deb
SHA256: 8822

Package: media-types
Version: 13.0.0
Filename: pool/main/m/media-types/media-types_13.0.0_all.deb
SHA256: 9933

Package: tzdata
Version: 2025b-4
Depends: debconf (>= 0.5) | debconf-2.0
Filename: pool/main/t/tzdata/tzdata_2025b-4_all.deb
SHA256: aa44
"""


def test_a_stanza_gives_name_version_file_checksum_and_dependencies() -> None:
    package = parse_index(INDEX)["python3.13-minimal"]
    assert package.version == "3.13.5-2"
    assert package.filename == "pool/main/p/python3.13/python3.13-minimal_3.13.5-2_amd64.deb"
    assert package.sha256 == "11bb"
    assert package.depends == (("libc6",), ("libexpat1",), ("zlib1g",))


def test_alternatives_versions_and_architecture_qualifiers() -> None:
    index = parse_index(INDEX)
    assert index["libpython3.13-stdlib"].depends == (
        ("libpython3.13-minimal",),
        ("libdb5.3", "libgdbm-compat"),
        ("libssl3t64",),
    )
    assert index["libdb5.3t64"].provides == ("libdb5.3",)
    assert index["python3.13"].depends == (  # not the description's continuation line
        ("python3.13-minimal",),
        ("libpython3.13-stdlib",),
        ("media-types", "mime-support"),
        ("tzdata",),
    )


def test_the_closure_follows_dependencies_and_virtual_packages_once_each() -> None:
    chosen = closure(parse_index(INDEX), ["python3.13"], leave_out=["media-types", "tzdata"])
    assert [p.name for p in chosen] == [
        "python3.13",
        "python3.13-minimal",
        "libpython3.13-stdlib",
        "libc6",
        "libexpat1",
        "zlib1g",
        "libpython3.13-minimal",
        "libdb5.3t64",
        "libssl3t64",
    ]


def test_a_group_with_a_left_out_alternative_is_left_out_whole() -> None:
    chosen = closure(parse_index(INDEX), ["tzdata", "python3.13"], leave_out=["debconf"])
    names = [p.name for p in chosen]
    assert "tzdata" in names and "media-types" in names
    assert "debconf" not in names


def test_a_dependency_the_index_lacks_is_named() -> None:
    index = parse_index(INDEX)
    with pytest.raises(PackageIndexError, match=re.escape("tzdata needs debconf | debconf-2.0")):
        closure(index, ["tzdata"])
    with pytest.raises(
        PackageIndexError, match=re.escape("python3.14 is not in the package index")
    ):
        closure(index, ["python3.14"])


def test_a_download_must_have_the_checksum_the_index_gives() -> None:
    content = b"a .deb"
    package = parse_index(
        INDEX.replace("SHA256: 6600", "SHA256: " + hashlib.sha256(content).hexdigest())
    )["zlib1g"]
    check_sha256(package, content)
    with pytest.raises(PackageIndexError, match=re.escape("zlib1g_1.3.1-1_amd64.deb: sha256")):
        check_sha256(package, content + b" altered")
