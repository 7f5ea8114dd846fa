"""`PDGW_...` environment variables: overrides of any setting, applied to the parsed
document before validation."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from router.config.errors import ConfigError

ENV_PREFIX = "PDGW_"


def apply_environment(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Environment overrides of any setting: `PDGW_SERVER__PORT=9000` sets `server.port`
    (`__` between levels, list entries by index: `PDGW_MODELS__0__OUTPUT_PARSER`); values
    are read as YAML scalars or lists. `PDGW_..._FILE=/path` sets the same setting to the
    file's contents, for secrets mounted as files."""
    for name in sorted(k for k in environ if k.startswith(ENV_PREFIX)):
        value: Any = environ[name]
        key = name[len(ENV_PREFIX) :]
        if key.endswith("_FILE"):
            key = key[: -len("_FILE")]
            try:
                value = Path(value).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ConfigError(f"{name}: cannot read {value}: {exc.strerror}") from None
        else:
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError:
                pass  # a plain string after all
        _set_path(data, key.lower().split("__"), value, name)
    return data


def _set_path(data: Any, path: list[str], value: Any, name: str) -> None:
    for i, part in enumerate(path):
        last = i == len(path) - 1
        if isinstance(data, list):
            if not part.isdigit() or int(part) >= len(data):
                raise ConfigError(f"{name}: no entry {part} in the list at that level")
            if last:
                data[int(part)] = value
            else:
                data = data[int(part)]
        elif isinstance(data, dict):
            if last:
                data[part] = value
            else:
                data = data.setdefault(part, {})
        else:
            raise ConfigError(f"{name}: the setting above '{part}' is not a section")
