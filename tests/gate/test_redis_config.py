"""`gate.redis` settings: validated by field, and where the password comes from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from router.config import ConfigError, RedisGateConfig, load_config, parse_config
from router.gate.redis import redis_password


def gate_section(**redis: Any) -> dict[str, Any]:
    return {
        "gate": {"backend": "redis", "redis": redis},
        "models": [
            {"name": "m", "tokenizer": "t", "throughput": {"mode": "proxy", "urls": ["http://x"]}}
        ],
    }


@pytest.mark.parametrize(
    ("redis", "field"),
    [
        ({"url": "http://cache:6379"}, "gate.redis.url"),
        ({"url": "redis://cache:6379", "key_prefix": "a b"}, "gate.redis.key_prefix"),
        ({"url": "redis://cache:6379", "lease_ttl_s": 0}, "gate.redis.lease_ttl_s"),
        ({"url": "redis://cache:6379", "renew_every_s": 6}, "renew_every_s"),
        ({"url": "redis://cache:6379", "poll_s": -1}, "gate.redis.poll_s"),
        ({}, "gate.redis.url"),
    ],
)
def test_invalid_redis_settings_name_the_field(redis: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        parse_config(gate_section(**redis))


def test_the_redis_backend_needs_its_settings() -> None:
    with pytest.raises(ConfigError, match=r"gate\.redis"):
        parse_config({**gate_section(), "gate": {"backend": "redis"}})
    config = parse_config(gate_section(url="rediss://:pw@cache:6380/2"))
    assert config.gate.redis is not None and config.gate.redis.key_prefix == "pdgw"


def test_the_password_is_read_from_its_one_source(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("from-file\n")
    assert redis_password(RedisGateConfig(url="redis://h", password_file=str(secret))) == (
        "from-file"
    )
    assert redis_password(RedisGateConfig(url="redis://h", password="given")) == "given"
    assert redis_password(RedisGateConfig(url="redis://:in-url@h")) is None  # the URL's own
    assert redis_password(RedisGateConfig(url="redis://h")) is None
    with pytest.raises(ConfigError, match=r"gate\.redis\.password_file: cannot read"):
        redis_password(RedisGateConfig(url="redis://h", password_file=str(tmp_path / "none")))


@pytest.mark.parametrize(
    "redis",
    [
        {"url": "redis://:x@h", "password": "y"},
        {"url": "redis://h", "password": "y", "password_file": "/run/secret"},
        {"url": "redis://user:x@h", "password_file": "/run/secret"},
    ],
)
def test_the_password_is_given_one_way_only(redis: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"gate\.redis: .*one way only"):
        parse_config(gate_section(**redis))


def test_the_environment_sets_the_password(tmp_path: Path) -> None:
    (tmp_path / "router.yaml").write_text(yaml.safe_dump(gate_section(url="redis://cache")))
    (tmp_path / "secret").write_text("from-a-file\n")
    config = load_config(tmp_path / "router.yaml", {"PDGW_GATE__REDIS__PASSWORD": "from-env"})
    assert config.gate.redis is not None and redis_password(config.gate.redis) == "from-env"
    environ = {"PDGW_GATE__REDIS__PASSWORD_FILE": str(tmp_path / "secret")}
    config = load_config(tmp_path / "router.yaml", environ)
    assert config.gate.redis is not None and redis_password(config.gate.redis) == "from-a-file"


@pytest.mark.parametrize(
    "url",
    [
        "redis://a:1,b:2",  # several servers: a Cluster or Sentinels
        "redis+cluster://a:6379/1",  # a Cluster has database 0 only
        "redis+sentinel://s:26379",  # the master's name is missing
        "redis+sentinel://s:26379/gate/x",
        "redis+cluster://a:6379,:7000",
        "redis+cluster://a:70000",
        "redis+sentinel://s:port/gate",
        "redis+memcache://a",
    ],
)
def test_a_redis_url_that_names_no_deployment_is_refused(url: str) -> None:
    with pytest.raises(ConfigError, match=r"gate\.redis\.url"):
        parse_config(gate_section(url=url))


@pytest.mark.parametrize(
    ("url", "deployment", "hosts", "master", "db"),
    [
        ("redis://cache:6380/2", "single", [("cache", 6380)], None, 2),
        ("rediss://cache", "single", [("cache", 6379)], None, 0),
        ("redis+cluster://a:7000,b:7001", "cluster", [("a", 7000), ("b", 7001)], None, 0),
        ("rediss+cluster://[::1]:7000/0", "cluster", [("::1", 7000)], None, 0),
        (
            "redis+sentinel://s1,s2:26380/gate",
            "sentinel",
            [("s1", 26379), ("s2", 26380)],
            "gate",
            0,
        ),
        ("redis+sentinel://s:26379/gate/3", "sentinel", [("s", 26379)], "gate", 3),
    ],
)
def test_a_redis_url_names_its_deployment(
    url: str, deployment: str, hosts: list[tuple[str, int]], master: str | None, db: int
) -> None:
    address = RedisGateConfig(url=url).address
    assert (address.deployment, list(address.hosts), address.master, address.db) == (
        deployment,
        hosts,
        master,
        db,
    )
    assert address.tls == url.startswith("rediss")


def test_a_cluster_or_sentinel_url_may_carry_the_password() -> None:
    address = RedisGateConfig(url="redis+sentinel://:p%40ss@s:26379/gate").address
    assert address.password == "p@ss"
    with pytest.raises(ConfigError, match="one way only"):
        parse_config(gate_section(url="redis+cluster://:pw@a:7000", password="other"))
