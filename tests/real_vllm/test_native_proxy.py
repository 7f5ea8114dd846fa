"""The native path in proxy mode, in front of real vLLM: whatever vLLM answers reaches the
client unchanged, byte for byte but for ids and times (each server makes its own)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.real_vllm.cases import NATIVE_CASES
from tests.real_vllm.compare import both_ways
from tests.real_vllm.conftest import RealVllm
from tests.support.gateway import GatewayProcess, start_gateway


@pytest.fixture(scope="module")
def gateway(
    real_vllm: RealVllm, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    model = {
        "name": real_vllm.model,
        "tokenizer": str(real_vllm.model_dir),
        "throughput": {"mode": "proxy", "urls": [real_vllm.url]},
    }
    with start_gateway(tmp_path_factory, [model]) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=120) as client:
        yield client


@pytest.mark.parametrize("case", NATIVE_CASES)
def test_the_proxied_answer_is_vllms(
    case: str, real_vllm: RealVllm, gateway: GatewayProcess, client: httpx.Client
) -> None:
    path, body = NATIVE_CASES[case]
    direct, proxied = both_ways(client, real_vllm.url, gateway.url, path, body)
    assert direct.status == 200, direct.body
    assert proxied == direct
