"""Probes that send `HEAD` (load balancers, uptime checks) get the `GET` answer's status and
headers, and no body, from a running gateway."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.support.gateway import GatewayProcess, start_gateway

# A model whose only backend is never reached: probes do not depend on one.
MODELS = [
    {
        "name": "m",
        "tokenizer": "deepseek",
        "throughput": {"mode": "proxy", "urls": ["http://127.0.0.1:9"]},
    }
]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with start_gateway(tmp_path_factory, MODELS) as gateway:
        yield gateway


def exchange(gateway: GatewayProcess, method: str, path: str) -> bytes:
    """Everything the gateway sends back on one connection, until it closes it."""
    address = urlsplit(gateway.url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as conn:
        conn.sendall(f"{method} {path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n".encode())
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    return received


@pytest.mark.parametrize("path", ["/health", "/ready", "/version", "/metrics"])
def test_head_answers_200_without_a_body(gateway: GatewayProcess, path: str) -> None:
    head, _, body = exchange(gateway, "HEAD", path).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert body == b""
    get_head, _, get_body = exchange(gateway, "GET", path).partition(b"\r\n\r\n")
    assert get_head.startswith(b"HTTP/1.1 200 ")
    assert get_body != b""
