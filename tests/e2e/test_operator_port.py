"""`server.operator_port`: the operator's endpoints (`/metrics`, `/admin/...`) on a port of
their own, so that a NetworkPolicy can keep them from the API's clients. A real gateway
process: each path is answered on its own port and refused (404, OpenAI's error shape) on
the other; the probes are answered on both."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from router.config import ConfigError, parse_config
from tests.gate.redis_server import running_redis
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.ports import unclaimed_port

pytestmark = pytest.mark.e2e

MODEL = {
    "name": "m",
    "tokenizer": "deepseek",
    "throughput": {"mode": "proxy", "urls": ["http://127.0.0.1:9"]},
}
ADMIN_KEY = "operator-port-admin-key"


@pytest.fixture(scope="module")
def operator_port() -> int:
    return unclaimed_port()


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, operator_port: int
) -> Iterator[GatewayProcess]:
    with start_gateway(
        tmp_path_factory,
        [MODEL],
        server={"operator_port": operator_port},
        admin={"api_key": ADMIN_KEY},
    ) as running:
        yield running


def get(url: str, **headers: str) -> httpx.Response:
    return httpx.get(url, headers=headers, timeout=10)


def test_the_operators_endpoints_are_on_their_port_alone(
    gateway: GatewayProcess, operator_port: int
) -> None:
    operator = f"http://127.0.0.1:{operator_port}"
    assert get(operator + "/metrics").status_code == 200
    assert "pd_gateway_build_info" in get(operator + "/metrics").text
    admin = get(operator + "/admin/pool", authorization=f"Bearer {ADMIN_KEY}")
    assert admin.status_code == 200
    for path in ("/metrics", "/admin/pool"):
        refused = get(gateway.url + path, authorization=f"Bearer {ADMIN_KEY}")
        assert refused.status_code == 404
        assert refused.json()["error"]["code"] == "not_found"
        assert path in refused.json()["error"]["message"]


def test_the_api_is_not_on_the_operators_port(gateway: GatewayProcess, operator_port: int) -> None:
    operator = f"http://127.0.0.1:{operator_port}"
    assert get(gateway.url + "/v1/models").status_code == 200
    refused = get(operator + "/v1/models")
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"
    chat = httpx.post(
        operator + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        timeout=10,
    )
    assert chat.status_code == 404


def test_the_probes_are_on_both_ports(gateway: GatewayProcess, operator_port: int) -> None:
    for base in (gateway.url, f"http://127.0.0.1:{operator_port}"):
        assert get(base + "/health").status_code == 200
        assert get(base + "/ready").status_code == 200


def test_one_port_for_both_is_refused() -> None:
    with pytest.raises(ConfigError, match="operator_port is port"):
        parse_config({"server": {"port": 8000, "operator_port": 8000}, "models": [MODEL]})


def test_workers_share_both_ports(tmp_path_factory: pytest.TempPathFactory) -> None:
    port = unclaimed_port()
    server = {"operator_port": port, "workers": 2}
    with (
        running_redis() as redis,
        start_gateway(
            tmp_path_factory,
            [MODEL],
            server=server,
            gate={"backend": "redis", "redis": {"url": redis.url, "key_prefix": "operator"}},
        ) as gateway,
    ):
        assert get(f"http://127.0.0.1:{port}/metrics").status_code == 200
        assert get(gateway.url + "/metrics").status_code == 404
        assert get(gateway.url + "/v1/models").status_code == 200
