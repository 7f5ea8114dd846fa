"""The one configuration error, and its message from pydantic's validation errors: each
offending field as a dotted path with the value it had, and a suggestion for a misspelt
name."""

from __future__ import annotations

import difflib
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from router.config.schema import GatewayConfig, StrictModel


class ConfigError(Exception):
    """router.yaml could not be loaded; the message names the field and value."""


def describe(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        value = err.get("input")
        shown = "" if isinstance(value, dict | list) else f" (got {value!r})"
        hint = ""
        if err["type"] == "extra_forbidden" and err["loc"]:
            close = difflib.get_close_matches(str(err["loc"][-1]), _field_names(), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
        lines.append(f"{where}: {err['msg']}{shown}{hint}")
    return f"{source} is invalid:\n  " + "\n  ".join(lines)


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
