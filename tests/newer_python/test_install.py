"""What `python -m tests.newer_python.install` does to the Python it unpacks: Debian's
packages ship no bytecode, and where PYTHONDONTWRITEBYTECODE is set every process on that
Python would compile what it imports again, so the install compiles the standard library."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.newer_python.install import compile_library


@pytest.mark.e2e  # compileall runs as a process of its own
def test_every_module_of_a_library_gets_its_bytecode(tmp_path: Path) -> None:
    library = tmp_path / "lib"
    (library / "json").mkdir(parents=True)
    modules = [library / "os_like.py", library / "json" / "__init__.py", library / "json" / "x.py"]
    for module in modules:
        module.write_text("VALUE = 1\n")
    compile_library(Path(sys.executable), library)
    tag = sys.implementation.cache_tag
    uncompiled = [
        m for m in modules if not (m.parent / "__pycache__" / f"{m.stem}.{tag}.pyc").exists()
    ]
    assert uncompiled == []
