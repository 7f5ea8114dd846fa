"""`pd-gateway check --probe`: with `gate.backend: redis`, the gate's Redis is reached as the
gate reaches it (URL, password, timeouts) and its scripts load; a Redis that is down, or that
refuses the password, fails the check with status 1 and one `error:` line naming the field,
the password never shown. Runs a real redis-server, hence `e2e`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.cli import main
from router.gate.redis.scripts import SCRIPTS
from sim.stack import SimStack
from tests.gate.redis_deployments import (
    LocalCluster,
    LocalSentinel,
    running_cluster,
    running_sentinel,
)
from tests.gate.redis_server import RedisServer, free_port, running_redis
from tests.support.deployment import node_entry

pytestmark = pytest.mark.e2e

GLM_TOKENIZER = Path(__file__).resolve().parents[2] / "sim" / "fixtures" / "glm"
PASSWORD = "s3cret-probe-password"


@pytest.fixture(scope="module")
def proxy() -> Iterator[str]:
    """A healthy proxy serving `m`, for configurations that are about the gate's Redis."""
    with SimStack(nodes=0, prefills=0, proxy=True, model="m") as stack:
        assert stack.proxy is not None
        yield stack.proxy.url


@pytest.fixture
def config_file(proxy: str) -> Callable[[Path, dict[str, Any]], Path]:
    def write(tmp_path: Path, gate: dict[str, Any]) -> Path:
        document = {
            "gate": gate,
            "models": [
                {
                    "name": "m",
                    "tokenizer": str(GLM_TOKENIZER),
                    # No TileRT node to reach: these tests are about the gate's Redis.
                    "throughput": {"mode": "proxy", "urls": [proxy]},
                }
            ],
        }
        path = tmp_path / "router.yaml"
        path.write_text(yaml.safe_dump(document), encoding="utf-8")
        return path

    return write


def gate_line(out: str) -> str:
    (line,) = [line for line in out.splitlines() if line.startswith("gate: ")]
    return line


def redis_gate(url: str, **settings: Any) -> dict[str, Any]:
    return {"backend": "redis", "redis": {"url": url, "socket_timeout_s": 1, **settings}}


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[RedisServer]:
    server = RedisServer(extra_args=["--requirepass", PASSWORD])
    try:
        server.start()
        yield server
    finally:
        server.close()


def test_a_reachable_redis_passes_and_every_script_loads(
    tmp_path: Path,
    redis: RedisServer,
    capsys: pytest.CaptureFixture[str],
    config_file: Callable[[Path, dict[str, Any]], Path],
) -> None:
    path = config_file(tmp_path, redis_gate(redis.url))
    assert main(["check", "--config", str(path), "--probe"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"{path}: ok (1 model(s); keys, tokenizers and templates read)"
    assert gate_line(out).startswith(f"gate: redis at {redis.url} answers (")
    assert gate_line(out).endswith(f"{len(SCRIPTS)} gate scripts loaded")


def test_without_probe_redis_is_not_contacted(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    config_file: Callable[[Path, dict[str, Any]], Path],
) -> None:
    path = config_file(tmp_path, redis_gate(f"redis://127.0.0.1:{free_port()}/0"))
    assert main(["check", "--config", str(path)]) == 0
    assert "gate:" not in capsys.readouterr().out


def test_the_memory_backend_has_nothing_to_probe(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    config_file: Callable[[Path, dict[str, Any]], Path],
) -> None:
    path = config_file(tmp_path, {"backend": "memory"})
    assert main(["check", "--config", str(path), "--probe"]) == 0
    assert gate_line(capsys.readouterr().out) == "gate: memory backend, nothing to probe"


def test_a_redis_that_is_down_fails_the_check(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    config_file: Callable[[Path, dict[str, Any]], Path],
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    path = config_file(tmp_path, redis_gate(url))
    started = time.monotonic()
    assert main(["check", "--config", str(path), "--probe"]) == 1
    assert time.monotonic() - started < 10  # bounded by socket_timeout_s, not a hang
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {path}: gate.redis.url: {url}: cannot reach it: ")


def test_the_password_from_a_mounted_file_opens_a_locked_redis(
    tmp_path: Path,
    locked_redis: RedisServer,
    capsys: pytest.CaptureFixture[str],
    config_file: Callable[[Path, dict[str, Any]], Path],
) -> None:
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n", encoding="utf-8")
    gate = redis_gate(locked_redis.url, password_file=str(secret))
    assert main(["check", "--config", str(config_file(tmp_path, gate)), "--probe"]) == 0
    assert f"{len(SCRIPTS)} gate scripts loaded" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("how", "problem"),
    [
        ("none", "it wants a password (gate.redis.password_file or password)"),
        ("wrong", "the password was refused"),
    ],
)
def test_a_missing_or_wrong_password_fails_the_check_without_showing_it(
    tmp_path: Path,
    locked_redis: RedisServer,
    capsys: pytest.CaptureFixture[str],
    how: str,
    problem: str,
    config_file: Callable[[Path, dict[str, Any]], Path],
) -> None:
    url = locked_redis.url
    if how == "wrong":
        url = url.replace("redis://", "redis://:not-the-password@")
    path = config_file(tmp_path, redis_gate(url))
    assert main(["check", "--config", str(path), "--probe"]) == 1
    err = capsys.readouterr().err
    (line,) = err.splitlines()
    shown = locked_redis.url.replace("redis://", "redis://:***@") if how == "wrong" else url
    assert line.startswith(f"error: {path}: gate.redis.url: {shown}: {problem}: "), line
    assert "not-the-password" not in err


def test_an_unreadable_password_file_is_a_configuration_error(
    tmp_path: Path,
    locked_redis: RedisServer,
    capsys: pytest.CaptureFixture[str],
    config_file: Callable[[Path, dict[str, Any]], Path],
) -> None:
    gate = redis_gate(locked_redis.url, password_file=str(tmp_path / "absent"))
    path = config_file(tmp_path, gate)
    assert main(["check", "--config", str(path), "--probe"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {path}: gate.redis.password_file: cannot read ")


def test_every_node_reports_its_release_and_features(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with SimStack(nodes=1, prefills=0, node_args=["--protocol", "0.1.5"]) as old:
        with SimStack(nodes=1, prefills=0) as new:
            nodes = [node_entry(new.nodes[0]), node_entry(old.nodes[0])]
            document = {
                "models": [
                    {
                        "name": "m",
                        "tokenizer": str(GLM_TOKENIZER),
                        "latency": {"prefill": ["http://127.0.0.1:9"], "nodes": nodes},
                    }
                ]
            }
            path = tmp_path / "router.yaml"
            path.write_text(yaml.safe_dump(document), encoding="utf-8")
            status = main(["check", "--config", str(path), "--probe"])
    out, err = capsys.readouterr()
    new_id = f"127.0.0.1:{new.nodes[0].http_port}"
    old_id = f"127.0.0.1:{old.nodes[0].http_port}"
    assert status == 1
    assert f"node {new_id} (model m, pool default): TileRT 0.1.6, features: ignore_eos" in out
    assert (
        f"error: node {old_id} (model m, pool default): runs TileRT 0.1.5, its pool is 0.1.6" in err
    )


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[LocalCluster]:
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def redis_sentinel() -> Iterator[LocalSentinel]:
    with running_sentinel() as sentinel:
        yield sentinel


@pytest.mark.parametrize("deployment", ["redis_cluster", "redis_sentinel"])
def test_a_cluster_or_sentinel_is_probed_as_the_gate_reaches_it(
    tmp_path: Path,
    deployment: str,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
    config_file: Callable[[Path, dict[str, Any]], Path],
) -> None:
    url = request.getfixturevalue(deployment).url
    path = config_file(tmp_path, redis_gate(url))
    assert main(["check", "--config", str(path), "--probe"]) == 0
    out = capsys.readouterr().out
    assert gate_line(out).startswith(f"gate: redis at {url} answers (")
    assert gate_line(out).endswith(f"{len(SCRIPTS)} gate scripts loaded")


def test_an_unreachable_sentinel_fails_the_check(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    config_file: Callable[[Path, dict[str, Any]], Path],
) -> None:
    url = f"redis+sentinel://127.0.0.1:{free_port()}/gate"
    path = config_file(tmp_path, redis_gate(url))
    assert main(["check", "--config", str(path), "--probe"]) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"error: {path}: gate.redis.url: {url}: cannot reach it: ")
