"""What `python -m tests.newer_python.install` leaves behind."""

from __future__ import annotations

import pytest

from tests.newer_python.install import INTERPRETER, PYTHON_HOME, RELEASE


def test_the_unpacked_standard_library_is_compiled() -> None:
    """Debian's packages ship no bytecode: without it, where PYTHONDONTWRITEBYTECODE is set,
    every process on this Python compiles what it imports again."""
    if not INTERPRETER.exists():
        pytest.fail("no Python 3.13 here: run `python -m tests.prepare`", pytrace=False)
    library = PYTHON_HOME / "usr" / "lib" / f"python{RELEASE}"
    tag = f"cpython-{RELEASE.replace('.', '')}"
    # Less Debian's sitecustomize.py, a link to /etc that compileall leaves alone.
    sources = [source for source in library.rglob("*.py") if not source.is_symlink()]
    uncompiled = [
        str(source.relative_to(library))
        for source in sources
        if not (source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc").exists()
    ]
    assert sources and uncompiled == []
