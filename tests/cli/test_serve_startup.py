"""`pd-gateway serve` whose start-up fails, run as the real command: one `error:` line on
stderr naming the problem, status 2 for the configuration and 1 for the environment, no
traceback."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.support.gateway_python import gateway_python
from tests.support.processes import run_in_group

pytestmark = pytest.mark.e2e

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONFIG = """
models:
  - name: m
    tokenizer: {tokenizer}
    latency:
      prefill: [http://127.0.0.1:9]
      nodes: [{{host: 127.0.0.1, ctrl_port: 9, http_port: 9}}]
"""
SHARED_GATE = """
gate:
  backend: redis
  redis: {url: "redis://127.0.0.1:9"}
server: {workers: 2}
"""


def serve(
    config: Path, *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return run_in_group(
        [gateway_python(), "-m", "router.cli", "serve", "--config", str(config), *flags],
        cwd=PROJECT_ROOT,
        env={**os.environ, **(env or {})},
        timeout_s=120,
    )


def error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def broken_tokenizer_config(tmp_path: Path, extra: str = "") -> Path:
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text('{"not": "a tokenizer"', encoding="utf-8")
    config = tmp_path / "router.yaml"
    config.write_text(CONFIG.format(tokenizer=tokenizer) + extra, encoding="utf-8")
    return config


def test_a_tokenizer_that_cannot_be_loaded_is_a_configuration_error(tmp_path: Path) -> None:
    config = broken_tokenizer_config(tmp_path)
    result = serve(config, "--port", "0")
    assert result.returncode == 2
    [line] = error_lines(result.stderr)
    assert line.startswith(f"error: {config}: models[0] (m).tokenizer: cannot load ")
    assert result.stderr.rstrip().endswith(line)
    assert "listening" not in result.stdout


def test_an_exporter_the_gateway_lacks_is_a_configuration_error(tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(CONFIG.format(tokenizer="deepseek"), encoding="utf-8")
    result = serve(config, "--port", "0", env={"OTEL_TRACES_EXPORTER": "zipkin"})
    assert result.returncode == 2
    assert error_lines(result.stderr) == [
        "error: OTEL_TRACES_EXPORTER: 'zipkin' is not one of otlp, console, none"
    ]


def test_a_port_in_use_is_an_environment_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = serve(PROJECT_ROOT / "router.yaml", "--port", str(port))
    assert result.returncode == 1
    assert error_lines(result.stderr) == [
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]


def test_workers_that_cannot_start_end_the_gateway_with_their_status(tmp_path: Path) -> None:
    # Redis is not there: the gate starts without it, the tokenizer is what fails.
    result = serve(broken_tokenizer_config(tmp_path, SHARED_GATE), "--port", "0")
    assert result.returncode == 2
    lines = error_lines(result.stderr)
    assert lines
    assert all("models[0] (m).tokenizer: cannot load " in line for line in lines)
