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
            *section, name = err["loc"]
            close = difflib.get_close_matches(str(name), _section_fields(section), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
        problems.append(f"{where}: {err['msg']}{shown}{hint}")
    return f"{source}: " + "; ".join(problems)


def _section_fields(loc: list[int | str]) -> set[str]:
    """The field names of the section at `loc` (of each section it may be, where a step
    is a list's index or a union's branch), for suggestions."""
    models: list[type[BaseModel]] = [GatewayConfig]
    for step in loc:
        inner = [
            nested
            for model in models
            if isinstance(step, str) and step in model.model_fields
            for nested in _nested(model.model_fields[step].annotation)
        ]
        models = inner or models  # an index or a branch: the same sections
    return {name for model in models for name in model.model_fields} - {"base_dir", "source"}


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
