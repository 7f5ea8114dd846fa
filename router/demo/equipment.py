"""The test equipment `pd-gateway demo` and `pd-gateway bench` run: the simulators (the
`sim` package) and the bench (`bench`). The wheel holds both; the container image holds the
gateway only, and there these commands say so in one line instead of failing at an import.
"""

from __future__ import annotations

import importlib


def missing_equipment(command: str, *packages: str) -> str | None:
    """Why `command` cannot run here (the packages it needs that are not installed), or None.
    Each is imported: one of them may need another that is missing."""
    missing: list[str] = []
    for name in packages:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name not in packages:
                raise  # a dependency of theirs: not what this is about
            if exc.name not in missing:
                missing.append(exc.name)
    if not missing:
        return None
    names = " and ".join(f"the {name} package" for name in missing)
    return (
        f"{command} needs {names}, which this installation leaves out (the container image"
        " holds the gateway only); run it where pd-gateway is installed from its source or"
        " its wheel"
    )
