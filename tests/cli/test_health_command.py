"""`pd-gateway health`, the container image's health check, run as the real command
against a real gateway: 0 when the gateway its configuration names answers `/health`,
1 (and why, on stderr) when nothing answers, 2 for a configuration it cannot ask."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.gateway_python import gateway_python
from tests.support.processes import run_in_group

pytestmark = pytest.mark.e2e

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MODEL = {
    "name": "m",
    "tokenizer": "deepseek",
    "throughput": {"mode": "proxy", "urls": ["http://127.0.0.1:9"]},
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with start_gateway(tmp_path_factory, [MODEL]) as running:
        yield running


def health(config: Path, port: int | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if port is not None:
        env["PDGW_SERVER__PORT"] = str(port)  # as an operator overrides the file's port
    return run_in_group(
        [gateway_python(), "-m", "router.cli", "health", "--config", str(config)],
        cwd=PROJECT_ROOT,
        env=env,
        timeout_s=60,
    )


def port_of(gateway: GatewayProcess) -> int:
    return int(gateway.url.rsplit(":", 1)[1])


def test_a_running_gateway_is_healthy(gateway: GatewayProcess) -> None:
    result = health(gateway.config_path, port_of(gateway))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"http://127.0.0.1:{port_of(gateway)}/health: 200"


def test_nothing_listening_is_unhealthy(gateway: GatewayProcess) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, never listening: connections are refused
        result = health(gateway.config_path, port)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith(f"http://127.0.0.1:{port}/health: ")
    assert "Traceback" not in result.stderr


def test_a_configuration_on_any_free_port_cannot_be_asked(gateway: GatewayProcess) -> None:
    result = health(gateway.config_path)  # the test's router.yaml says port 0
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: {gateway.config_path}: server.port is 0 (any free port): nothing to ask"
    )
