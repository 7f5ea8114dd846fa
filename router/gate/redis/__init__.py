"""`gate.backend: redis`: one pool shared by every gateway replica through one Redis (a
single server, a Redis Cluster or a Sentinel-managed master; docs/redis.md)."""

from __future__ import annotations

from pathlib import Path

from router.config import ConfigError, GateConfig, RedisGateConfig, read_secret
from router.gate.events import GateEvents
from router.gate.redis.admin import GateUnavailable
from router.gate.redis.gate import RedisGate
from router.gate.redis.lease import RedisLease
from router.node import Node

__all__ = ["GateUnavailable", "RedisGate", "RedisLease", "make_redis_gate", "redis_password"]


def redis_password(config: RedisGateConfig) -> str | None:
    """From `password_file` (a mounted secret) or `password`; None when there is none, or
    when the URL carries it (configuration allows one of the three at most)."""
    try:
        return read_secret(
            value=config.password, env=None, file=config.password_file, base_dir=Path.cwd()
        )
    except ValueError as exc:
        raise ConfigError(f"gate.redis.password_file: {exc}") from None


def make_redis_gate(
    config: GateConfig,
    nodes: list[Node],
    metrics: GateEvents | None = None,
    *,
    pool_id: str = "",
) -> RedisGate:
    if config.redis is None:
        raise ConfigError("gate.redis: required with backend: redis")
    return RedisGate(
        nodes,
        config=config.redis,
        password=redis_password(config.redis),
        max_queue=config.max_queue,
        failure_threshold=config.failure_threshold,
        cooldown_s=config.node_cooldown_s,
        metrics=metrics,
        pool_id=pool_id,
    )
