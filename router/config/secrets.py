"""Secrets in the configuration: given directly, through an environment variable, or in
a mounted file (Kubernetes secrets), at most one way each."""

from __future__ import annotations

import os
from pathlib import Path


def read_secret(
    *, value: str | None, env: str | None, file: str | None, base_dir: Path
) -> str | None:
    """A secret given directly, through an environment variable, or in a mounted file
    (relative to the configuration file); at most one way. Raises ValueError."""
    if sum(v is not None for v in (value, env, file)) > 1:
        raise ValueError("give the secret one way only")
    if env is not None:
        secret = os.environ.get(env)
        if not secret:
            raise ValueError(f"the environment variable {env} is not set")
        return secret
    if file is not None:
        path = Path(file) if Path(file).is_absolute() else base_dir / file
        try:
            secret = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror}") from None
        if not secret:
            raise ValueError(f"{path} is empty")
        return secret
    return value
