"""Where the tenants' counts live: the gate's Redis when the pool is shared (every replica
counts against one allowance), else this process's memory."""

from __future__ import annotations

from router.config import ConfigError, GatewayConfig
from router.tenants.limiter import Limiter, MemoryLimiter

_MAX_CONNECTIONS = 8


def make_limiter(config: GatewayConfig) -> Limiter:
    redis = config.gate.redis
    if config.gate.backend != "redis" or redis is None:
        return MemoryLimiter(max_keys=2 * config.tenants.max_tracked)
    # The Redis client is loaded only for a pool on Redis (0.1 s of every start otherwise).
    from router.gate.redis import redis_password
    from router.gate.redis.client import connect
    from router.tenants.redis_limiter import RedisLimiter

    try:
        password = redis_password(redis)
    except ConfigError as exc:
        raise ConfigError(f"{config.source}: {exc}") from None
    client = connect(redis, password, max_connections=_MAX_CONNECTIONS)
    return RedisLimiter(client, f"{redis.key_prefix}:tenants", max_calls=_MAX_CONNECTIONS)
