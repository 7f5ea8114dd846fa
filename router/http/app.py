"""The ASGI application, built by a factory from a validated configuration."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router import __version__
from router.config import ConfigError, GatewayConfig
from router.errors import GatewayError, InvalidRequest, ModelNotFound, NotFound
from router.http.dispatch import Dispatcher
from router.http.json_response import error_response, json_response
from router.http.model_cards import ModelCards
from router.http.request_context import RequestContext
from router.openai.endpoints import ENDPOINTS, EndpointSpec, endpoint_meant
from router.runtime.state import AppState
from router.serving.response import SERVER_SEND
from router.telemetry import tracing
from router.telemetry.access import AccessRecord

log = logging.getLogger("pd_gateway")


def create_app(config: GatewayConfig) -> GatewayApp:
    """The app for `config`. Raises ConfigError (before anything is served) for secrets that
    cannot be read or an admin API that would be open to the network."""
    state = AppState(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            traces = tracing.from_environment(os.environ)
            if traces is not None:
                traces.start()
            await state.start()
        except Exception as exc:
            # For whoever runs the app to report in its own words (router/process/server.py).
            app.state.startup_failure = exc
            raise
        app.state.gateway = state
        app.state.dispatcher = Dispatcher(state)
        try:
            yield
        finally:
            await state.aclose()
            if traces is not None:
                traces.shutdown()

    app = GatewayApp(title="pd-gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.metrics = state.metrics  # for the server's front door, before the app starts
    app.add_middleware(RequestContext, access_log=config.logging.access_log)
    generate = _generate_naming_upstream if config.server.expose_upstream else _generate
    app.generation = RequestContext(generate, access_log=config.logging.access_log)
    cards = ModelCards(state.upstreams)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        current = state.epoch
        current.keys.client.key_name(request.headers)
        data = await cards.cards(current.config.models)
        return json_response({"object": "list", "data": data})

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str) -> Response:
        current = state.epoch
        current.keys.client.key_name(request.headers)
        configured = current.config.model(model_id)
        if configured is None:
            raise ModelNotFound(f"the model '{model_id[:100]}' does not exist", param="model")
        return json_response(await cards.card(configured))

    for endpoint in ENDPOINTS.values():
        # Served by `GatewayApp.generation` ahead of routing; routed here too, so that the
        # OpenAPI description lists them and a mounted app (a root path) still serves them.
        app.add_api_route(
            endpoint.path,
            _served_by_dispatcher(endpoint),
            methods=["POST"],
            name=endpoint.name,
            summary=f"OpenAI {endpoint.name} ({endpoint.request.__name__})",
        )

    @app.api_route(
        "/v1/{rest:path}",
        methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
        include_in_schema=False,
    )
    async def unsupported(request: Request, rest: str) -> Response:
        """An OpenAI endpoint the gateway does not serve: said so, and counted."""
        endpoint = rest.split("/", 1)[0]
        state.metrics.unsupported(endpoint if endpoint in KNOWN_UNSUPPORTED else "other")
        raise _not_served(request, code="unsupported_endpoint")

    @app.get("/version")
    async def version() -> Response:
        return json_response({"name": "pd-gateway", "version": __version__})

    @app.get("/health")
    async def health() -> Response:
        return json_response({"status": "ok"})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        state: AppState = request.app.state.gateway
        return Response(await state.metrics_text(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/ready")
    async def ready(request: Request) -> Response:
        state: AppState = request.app.state.gateway
        if state.draining:
            return json_response({"status": "draining"}, status=503)
        return json_response({"status": "ready"})

    for route in (version, health, metrics, ready):  # HEAD, as probes send it: no body
        app.add_api_route(f"/{route.__name__}", route, methods=["HEAD"], include_in_schema=False)

    @app.get("/admin/pool")
    async def pool(request: Request) -> Response:
        state.epoch.keys.admin.check(request.headers)
        snapshots = await state.pool_snapshots()
        models = {
            name: {**dataclasses.asdict(s), "node_facts": state.node_facts(name)}
            for name, s in snapshots.items()
        }
        return json_response({"models": models, "background_tasks": state.background_tasks})

    @app.get("/admin/upstreams")
    async def upstream_servers(request: Request) -> Response:
        state.epoch.keys.admin.check(request.headers)
        return json_response({"models": state.upstream_servers()})

    @app.get("/admin/tenants")
    async def tenants(request: Request) -> Response:
        state.epoch.keys.admin.check(request.headers)
        return json_response(state.tenants.snapshot())

    @app.get("/admin/timings")
    async def timings(request: Request) -> Response:
        state.epoch.keys.admin.check(request.headers)
        models = {name: model.timings.snapshot() for name, model in state.epoch.models.items()}
        return json_response({"models": models})

    @app.get("/admin/sizing")
    async def sizing(request: Request) -> Response:
        state.epoch.keys.admin.check(request.headers)
        models = {
            name: {size.pool: dataclasses.asdict(size) for size in sizes}
            for name, sizes in state.sizes().items()
        }
        return json_response({"models": models})

    @app.post("/admin/reload")
    async def reload(request: Request) -> Response:
        state.epoch.keys.admin.check(request.headers)
        try:
            models = await state.reload()
        except ConfigError as exc:
            raise InvalidRequest(
                f"the configuration was not reloaded: {exc}", code="config_invalid"
            ) from None
        return json_response({"reloaded": True, "source": state.config.source, "models": models})

    @app.post("/admin/nodes/{node_id}/drain")
    async def drain(request: Request, node_id: str) -> Response:
        return await _set_drained(request, config, node_id, drained=True)

    @app.post("/admin/nodes/{node_id}/undrain")
    async def undrain(request: Request, node_id: str) -> Response:
        return await _set_drained(request, config, node_id, drained=False)

    for kind in (GatewayError, StarletteHTTPException, Exception):
        app.add_exception_handler(kind, _exception_handler)
    return app


def _served_by_dispatcher(endpoint: EndpointSpec) -> Callable[[Request], Awaitable[Response]]:
    async def generate(request: Request) -> Response:
        dispatcher: Dispatcher = request.app.state.dispatcher
        return await dispatcher.handle(request, endpoint)

    return generate


class GatewayApp(FastAPI):
    """FastAPI, with the server's own `send` in each request's scope: a stream's body
    chunks go straight to it (`PathResponse`), past the middlewares' wrappers of `send`,
    which only look at a response's start and end.

    The generation endpoints (`POST` to a path of `ENDPOINTS`) go straight to `generation`,
    past FastAPI's exception, routing and dependency layers (about 0.1 ms of CPU a request):
    it runs in its own `RequestContext` and renders errors as every route does."""

    generation: ASGIApp | None = None
    operator_port: int | None = None
    """With `server.operator_port`: the port the operator's endpoints are served on."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[SERVER_SEND] = send
        if self.operator_port is not None and scope["type"] == "http":
            if not _served_on(scope, self.operator_port):
                refused = NotFound(f"pd-gateway does not serve {scope['path'][:100]} on this port")
                await error_response(refused)(scope, receive, send)
                return
        if (
            self.generation is not None
            and scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] in _ENDPOINT_OF_PATH
            and not scope.get("root_path")
        ):
            scope["app"] = self
            await self.generation(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


PROBES = frozenset({"/health", "/ready", "/version"})
"""Served on both ports when the operator's endpoints have one of their own."""


def _for_operators(path: str) -> bool:
    return path == "/metrics" or path == "/admin" or path.startswith("/admin/")


def _served_on(scope: Scope, operator_port: int) -> bool:
    """Whether the request's path is served on the port it came to: the operator's paths
    on the operator port, the rest on the other, the probes on both."""
    path = scope["path"]
    if path in PROBES:
        return True
    server = scope.get("server")
    on_operator_port = server is not None and server[1] == operator_port
    return on_operator_port == _for_operators(path)


UPSTREAM_HEADER = b"x-pd-upstream"

_ENDPOINT_OF_PATH = {endpoint.path: endpoint for endpoint in ENDPOINTS.values()}


# OpenAI API families a client may try; anything else is counted as `other`.
KNOWN_UNSUPPORTED = frozenset(
    {
        "responses",
        "embeddings",
        "audio",
        "images",
        "moderations",
        "files",
        "batches",
        "assistants",
        "threads",
        "vector_stores",
        "fine_tuning",
        "uploads",
        "realtime",
    }
)


async def _generate(scope: Scope, receive: Receive, send: Send) -> None:
    request = Request(scope, receive)
    dispatcher: Dispatcher = request.app.state.dispatcher
    try:
        response = await dispatcher.handle(request, _ENDPOINT_OF_PATH[scope["path"]])
    except Exception as exc:
        response = await _exception_handler(request, exc)
    await response(scope, receive, send)


async def _generate_naming_upstream(scope: Scope, receive: Receive, send: Send) -> None:
    """`_generate`, and the answer names the chosen upstream and why (`x-pd-upstream`)."""
    access: AccessRecord = scope["state"]["access"]

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start" and access.upstream is not None:
            value = f"{access.upstream}; reason={access.upstream_reason}"
            message["headers"] = [*message.get("headers", ()), (UPSTREAM_HEADER, value.encode())]
        await send(message)

    await _generate(scope, receive, sending)


async def _exception_handler(request: Request, exc: Exception) -> Response:
    """Every error as an OpenAI-style answer, noted in the access record; one the gateway
    did not expect is logged."""
    if isinstance(exc, GatewayError):
        error = exc
    elif isinstance(exc, StarletteHTTPException) and exc.status_code == 404:
        error = _not_served(request, code=NotFound.code)  # no route has the path
    elif isinstance(exc, StarletteHTTPException):
        error = InvalidRequest(str(exc.detail), status=exc.status_code)
    else:
        log.exception("unexpected error serving %s", request.url.path)
        error = GatewayError("internal error in the gateway")
    access = request.scope.get("state", {}).get("access")
    if isinstance(access, AccessRecord):
        access.ended_with(error)
    return error_response(error)


def _not_served(request: Request, *, code: str | None) -> NotFound:
    """A path the gateway does not serve, named, with the endpoint the client probably
    meant (`/chat/completions` from a base URL without `/v1`)."""
    method, path = request.method, request.url.path
    message = f"pd-gateway does not serve {method} {path[:100]}"
    meant = endpoint_meant(path)
    if meant is not None:
        message += f"; did you mean POST {meant.path}?"
        if not path.startswith("/v1/"):
            message += " (an OpenAI client's base URL ends in /v1)"
    return NotFound(message, code=code)


async def _set_drained(
    request: Request, config: GatewayConfig, node_id: str, *, drained: bool
) -> Response:
    """Drain (finish the current request, take no more) or undrain a node, in every pool."""
    state: AppState = request.app.state.gateway
    state.epoch.keys.admin.check(request.headers)
    models = [
        model
        for model, gate in state.gates.items()
        if await (gate.drain(node_id) if drained else gate.undrain(node_id))
    ]
    if not models:
        raise NotFound(f"no TileRT node '{node_id}' in any pool", param="node_id")
    return json_response({"node": node_id, "models": models, "drained": drained})
