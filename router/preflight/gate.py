"""The gate's shared state (`gate.backend: redis`): connect as the gate does (one server, a
Cluster or Sentinel; password, timeouts), PING and SCRIPT LOAD every gate script."""

from __future__ import annotations

import asyncio
import functools
import sys
from typing import Any

from router.config import ConfigError, GatewayConfig, RedisGateConfig


def probe_gate(config: GatewayConfig) -> int:
    """With the redis backend, connect as the gate does and load its scripts. 0 if all went
    well, else 1 and an `error:` line naming the field (the configuration is valid; the
    world is not)."""
    redis_config = config.gate.redis
    if config.gate.backend != "redis" or redis_config is None:
        print(f"gate: {config.gate.backend} backend, nothing to probe")
        return 0
    from redis.exceptions import AuthenticationError

    from router.gate.redis import redis_password
    from router.gate.redis.client import UNAVAILABLE
    from router.gate.redis.scripts import SCRIPTS

    where = f"{config.source}: gate.redis.url"
    shown = _without_password(redis_config.url)
    try:
        password = redis_password(redis_config)
    except ConfigError as exc:
        raise ConfigError(f"{config.source}: {exc}") from None
    stage = ["cannot reach it"]
    try:
        round_trip_ms, kept = asyncio.run(_load_gate_scripts(redis_config, password, stage))
    except AuthenticationError as exc:
        refused = password or redis_config.url_has_password
        why = (
            "the password was refused"
            if refused
            else "it wants a password (gate.redis.password_file or password)"
        )
        return _probe_failed(where, shown, why, exc)
    except UNAVAILABLE as exc:
        return _probe_failed(where, shown, stage[0], exc)
    if missing := [name for name, ok in zip(SCRIPTS, kept, strict=True) if not ok]:
        return _probe_failed(where, shown, "scripts not kept", ", ".join(missing))
    print(
        f"gate: redis at {shown} answers ({round_trip_ms:.1f} ms),"
        f" {len(SCRIPTS)} gate scripts loaded"
    )
    return 0


async def _script_load(client: Any, *, source: str) -> str:
    sha: str = await client.script_load(source)
    return sha


async def _load_gate_scripts(
    redis_config: RedisGateConfig, password: str | None, stage: list[str]
) -> tuple[float, list[bool]]:
    """PING's round trip in ms, and whether each gate script is kept once loaded; `stage`
    says what was being tried when a call fails."""
    import time

    from router.gate.redis.client import connect
    from router.gate.redis.scripts import SCRIPTS

    redis = connect(redis_config, password, max_connections=2)
    try:
        sent_at = time.perf_counter()
        await redis.run(lambda client: client.ping())
        round_trip_ms = (time.perf_counter() - sent_at) * 1000
        stage[0] = "cannot load the gate's scripts"  # an ACL without the rights, say
        loaded: list[str] = []
        for source in SCRIPTS.values():
            loaded.append(await redis.run(functools.partial(_script_load, source=source)))
        kept: list[bool] = await redis.run(lambda client: client.script_exists(*loaded))
        return round_trip_ms, kept
    finally:
        await redis.aclose()


def _probe_failed(where: str, shown: str, what: str, why: object) -> int:
    print(f"error: {where}: {shown}: {what}: {why}", file=sys.stderr)
    return 1


def _without_password(url: str) -> str:
    """A Redis URL fit to print: the password in its user part is masked."""
    scheme, sep, rest = url.partition("://")
    address, slash, path = rest.partition("/")
    user, at, host = address.rpartition("@")
    if at and ":" in user:
        user = user.split(":", 1)[0] + ":***"
    return f"{scheme}{sep}{user}{at}{host}{slash}{path}"
