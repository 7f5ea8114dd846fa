"""The application's routes in process: the generation endpoints (served past FastAPI's
routing) answer failures as every route does, with the request's id, and any other method
on their paths is named."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from router.config import parse_config
from router.errors import InvalidRequest, Overloaded
from router.http.app import create_app
from router.openai.endpoints import ENDPOINTS, EndpointSpec

MODELS = [
    {"name": "m", "tokenizer": "deepseek", "throughput": {"mode": "proxy", "urls": ["http://p:1"]}}
]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class Raising:
    """A dispatcher that fails with `error` (the routes' only way into the paths)."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.requests: list[str] = []

    async def handle(self, request: Request, endpoint: Any) -> None:
        self.requests.append(endpoint.path)
        raise self.error


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    return create_app(parse_config({"models": MODELS}, base_dir=tmp_path))


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        yield client


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
async def test_a_failure_the_gateway_did_not_expect_is_an_openai_500_with_the_request_id(
    app: FastAPI, client: httpx.AsyncClient, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    app.state.dispatcher = dispatcher = Raising(RuntimeError("a bug"))
    with caplog.at_level(logging.ERROR, "pd_gateway"):
        response = await client.post(path, json=CHAT, headers={"x-request-id": "req-7"})
    assert dispatcher.requests == [path]
    assert response.status_code == 500
    assert response.json()["error"]["message"] == "internal error in the gateway"
    assert response.headers["x-request-id"] == "req-7"
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        f"unexpected error serving {path}"
    ]


async def test_a_gateway_error_keeps_its_status_code_and_headers(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    app.state.dispatcher = Raising(Overloaded("busy", retry_after_s=3, code="queue_full"))
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "3"
    assert response.json()["error"]["code"] == "queue_full"
    assert len(response.headers["x-request-id"]) == 32


async def test_another_method_on_a_generation_path_is_named_and_never_dispatched(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    app.state.dispatcher = dispatcher = Raising(RuntimeError("never called"))
    got = await client.get("/v1/chat/completions")
    assert got.status_code == 404
    assert got.json()["error"]["code"] == "unsupported_endpoint"
    assert "GET /v1/chat/completions" in got.json()["error"]["message"]
    options = await client.options("/v1/completions")
    assert options.status_code == 405 and "error" in options.json()
    assert dispatcher.requests == []


BASE_URL_HINT = " (an OpenAI client's base URL ends in /v1)"


@pytest.mark.parametrize("endpoint", ENDPOINTS.values(), ids=lambda e: e.name)
@pytest.mark.parametrize(
    ("sent", "code", "hint"),
    [
        (lambda path: path.removeprefix("/v1"), "not_found", BASE_URL_HINT),
        (lambda path: "/v1" + path, "unsupported_endpoint", ""),
        (lambda path: path + "/", "unsupported_endpoint", ""),
    ],
    ids=["without /v1", "with /v1 twice", "with a trailing slash"],
)
async def test_a_path_that_is_nearly_an_endpoints_is_named_with_the_endpoint_meant(
    app: FastAPI,
    client: httpx.AsyncClient,
    endpoint: EndpointSpec,
    sent: Callable[[str], str],
    code: str,
    hint: str,
) -> None:
    app.state.dispatcher = dispatcher = Raising(RuntimeError("never called"))
    path = sent(endpoint.path)
    got = await client.post(path, json=CHAT)
    assert got.status_code == 404
    assert got.json() == {
        "error": {
            "message": f"pd-gateway does not serve POST {path}; did you mean POST"
            f" {endpoint.path}?{hint}",
            "type": "invalid_request_error",
            "param": None,
            "code": code,
        }
    }
    assert dispatcher.requests == []


async def test_any_other_path_is_named_in_an_openai_error(client: httpx.AsyncClient) -> None:
    got = await client.get("/nowhere/at/all")
    assert got.status_code == 404
    assert got.json()["error"] == {
        "message": "pd-gateway does not serve GET /nowhere/at/all",
        "type": "invalid_request_error",
        "param": None,
        "code": "not_found",
    }


async def test_the_openapi_description_lists_the_endpoints_served(
    client: httpx.AsyncClient,
) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        assert list(paths[path]) == ["post"]
    assert "/v1/{rest}" not in paths
    assert list(paths["/health"]) == ["get"]


async def test_an_error_before_any_path_is_in_the_access_line_with_its_code(
    app: FastAPI, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    app.state.dispatcher = Raising(InvalidRequest("the body is not JSON", code="invalid_json"))
    with caplog.at_level(logging.INFO, "pd_gateway.access"):
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 400
    (line,) = [r for r in caplog.records if r.name == "pd_gateway.access"]
    access = line.access  # type: ignore[attr-defined]
    assert (access["status"], access["error_code"]) == (400, "invalid_json")
    assert access["client"] == "127.0.0.1"
