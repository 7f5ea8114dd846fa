"""The one configuration error, and its message from pydantic's validation errors, on one
line: each offending field as a dotted path with the value it had, and a suggestion for a
misspelt name."""

from __future__ import annotations

import difflib
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from router.config.settings import GatewayConfig, StrictModel


class ConfigError(Exception):
    """router.yaml could not be loaded; the message names the field and value."""


def describe(exc: ValidationError, source: str, data: Any = None) -> str:
    """`<source>: <field>: <problem>`, the problems of several fields separated by `; `.
    `data`: the document validated, to name fields as its reader sees them."""
    problems = []
    for err in exc.errors():
        where = field_path(err["loc"], data) or "(top level)"
        value = err.get("input")
        shown = "" if isinstance(value, dict | list) else f" (got {value!r})"
        hint = ""
        if err["type"] == "extra_forbidden" and err["loc"]:
            close = difflib.get_close_matches(str(err["loc"][-1]), _field_names(), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
        problems.append(f"{where}: {err['msg']}{shown}{hint}")
    return f"{source}: " + "; ".join(problems)


def _field_names() -> set[str]:
    """Every field name of every section, for suggestions."""
    models: list[type[BaseModel]] = [GatewayConfig]
    names: set[str] = set()
    while models:
        model = models.pop()
        for name, info in model.model_fields.items():
            if name not in ("base_dir", "source"):
                names.add(name)
            for arg in _nested(info.annotation):
                if arg not in models:
                    models.append(arg)
    return names


def _nested(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, StrictModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _nested(arg)]


def field_path(loc: tuple[int | str, ...], data: Any) -> str:
    """`('models', 0, 'latency', 'prefill', 1)` as `models[0] (ds).latency.prefill[1]`: list
    items by index, an item with a name by its name too. Steps that name no field of the
    document (a union's branch) are left out."""
    out = ""
    for i, step in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(step, int) and isinstance(data, list) and 0 <= step < len(data):
            data = data[step]
            name = data.get("name") if isinstance(data, dict) else None
            out += f"[{step}]" + (f" ({name})" if isinstance(name, str) else "")
        elif isinstance(data, dict) and step in data:
            data = data[step]
            out += f".{step}" if out else str(step)
        elif last or not isinstance(data, dict):
            out += f".{step}" if out else str(step)
            data = None
    return out
