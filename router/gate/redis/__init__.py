"""`gate.backend: redis`: one pool shared by every gateway replica through one Redis."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from router.config import ConfigError, GateConfig, NodeConfig, RedisGateConfig
from router.gate.redis.gate import GateUnavailable, RedisGate
from router.gate.redis.lease import RedisLease

__all__ = ["GateUnavailable", "RedisGate", "RedisLease", "make_redis_gate", "redis_password"]

PASSWORD_ENV = "PDGW_REDIS_PASSWORD"


def redis_password(config: RedisGateConfig) -> str | None:
    """`password_file` (a mounted secret) if set; else the URL's own password (None here:
    the URL carries it); else the environment variable PDGW_REDIS_PASSWORD."""
    if config.password_file is not None:
        path = Path(config.password_file)
        if urlsplit(config.url).password:
            raise ConfigError("gate.redis: give the password in url or in password_file, not both")
        try:
            return path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                f"gate.redis.password_file: cannot read {path}: {exc.strerror}"
            ) from None
    if urlsplit(config.url).password:
        return None
    return os.environ.get(PASSWORD_ENV) or None


def make_redis_gate(config: GateConfig, nodes: list[NodeConfig]) -> RedisGate:
    if config.redis is None:
        raise ConfigError("gate.redis: required with backend: redis")
    return RedisGate(
        nodes,
        config=config.redis,
        password=redis_password(config.redis),
        max_queue=config.max_queue,
        failure_threshold=config.failure_threshold,
        cooldown_s=config.node_cooldown_s,
    )
