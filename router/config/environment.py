"""`PDGW_...` environment variables: overrides of any setting, applied to the parsed
document before validation."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from router.config.errors import ConfigError

ENV_PREFIX = "PDGW_"

KEY_SETTINGS = frozenset(
    {
        "api_key",
        "api_key_env",
        "api_key_file",
        "key_env",
        "key_file",
        "sha256",
        "password",
        "password_file",
    }
)
"""Settings that hold a key or say where one is. From the environment an empty one
(nothing, blanks, `""`, `null`) is refused: an empty key is never a key, and an empty
variable must not remove the file's. Any other value is text (`123` is the key "123")."""


def apply_environment(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Environment overrides of any setting: `PDGW_SERVER__PORT=9000` sets `server.port`
    (`__` between levels, list entries by index: `PDGW_MODELS__0__OUTPUT_PARSER`); values
    are read as YAML scalars or lists, keys (`KEY_SETTINGS`) as text. `PDGW_..._FILE=/path`
    sets the same setting to the file's contents, for secrets mounted as files."""
    for name in sorted(k for k in environ if k.startswith(ENV_PREFIX)):
        raw = environ[name]
        value: Any = raw
        key = name[len(ENV_PREFIX) :]
        from_file = key.endswith("_FILE")
        if from_file:
            key = key[: -len("_FILE")]
            try:
                value = raw = Path(raw).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ConfigError(f"{name}: cannot read {raw}: {exc.strerror}") from None
        else:
            try:
                value = yaml.safe_load(raw)
            except yaml.YAMLError:
                pass  # a plain string after all
        path = key.lower().split("__")
        if path[-1] in KEY_SETTINGS:
            if value is None or (isinstance(value, str) and not value.strip()):
                what = f"{environ[name]} is empty" if from_file else "empty"
                raise ConfigError(
                    f"{name}: {what}, and an empty key is never a key (unset the variable"
                    " to keep the file's)"
                )
            if not isinstance(value, str):
                value = raw
        _set_path(data, path, value, name)
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
