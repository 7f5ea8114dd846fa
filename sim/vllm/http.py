"""The simulated vLLM server's HTTP routes: OpenAI endpoints and test-only ``/sim/`` ones."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sim.faults import FaultError
from sim.runner import Gate
from sim.vllm import metrics
from sim.vllm.availability import Availability
from sim.vllm.errors import error_body
from sim.vllm.server import GenerationEndpoint, VllmServer

# Not a fault of the board: it acts once, on the listening socket, when posted.
REFUSE_CONNECTIONS = "refuse_connections_ms"


def build_app(server: VllmServer, gate: Gate | None = None) -> Availability:
    """The ASGI app serving ``server``; ``gate`` lets ``/sim/faults`` refuse connections."""

    def generation(endpoint: GenerationEndpoint) -> Callable[[Request], Awaitable[Response]]:
        async def generate(request: Request) -> Response:
            headers = {k.lower(): v for k, v in request.headers.items()}
            return await server.handle(endpoint, request.url.path, await request.body(), headers)

        return generate

    async def models(request: Request) -> Response:
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": server.config.tokenizer,
                "parent": None,
                "max_model_len": server.config.max_model_len,
                "permission": [_permission(created)],
            }
            for name in server.config.served_model_names
        ]
        return JSONResponse({"object": "list", "data": data})

    async def tokenize(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
            tokens = server.tokenize(body)
        except (ValueError, TypeError, AttributeError) as exc:
            return JSONResponse(
                {"error": {"message": str(exc), "type": "BadRequestError", "code": 400}},
                status_code=400,
            )
        return JSONResponse(
            {
                "count": len(tokens),
                "max_model_len": server.config.max_model_len,
                "tokens": tokens,
                "token_strs": None,
            }
        )

    async def stored_response(request: Request) -> Response:
        # vLLM keeps no responses unless its store is switched on (an environment setting,
        # off by default): retrieving or cancelling one finds nothing.
        response_id = request.path_params["response_id"]
        message = f"Response with id '{response_id}' not found."
        body = error_body(404, message, "response_id", "invalid_request_error")
        return JSONResponse(body, status_code=404)

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def metrics_text(request: Request) -> Response:
        text = metrics.render(server.config.model_name, server.load, server.counters)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def sim_requests(request: Request) -> Response:
        return JSONResponse(server.records.to_json())

    async def sim_faults(request: Request) -> Response:
        if request.method == "DELETE":
            server.faults.clear()
        elif request.method == "POST":
            values = orjson.loads(await request.body() or b"{}")
            if not isinstance(values, dict):
                return JSONResponse({"error": "expected a JSON object"}, status_code=400)
            count = values.pop("count", None)
            refuse_ms = values.pop(REFUSE_CONNECTIONS, None)
            if refuse_ms is not None and (
                isinstance(refuse_ms, bool)
                or not isinstance(refuse_ms, int | float)
                or refuse_ms <= 0
                or gate is None
            ):
                return JSONResponse(
                    {"error": f"{REFUSE_CONNECTIONS} takes a positive number"}, status_code=400
                )
            try:
                server.faults.arm(values, count)
            except FaultError as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
            if refuse_ms is not None and gate is not None:
                # Close the socket once this answer is out, so the caller gets it.
                return JSONResponse(
                    {"faults": server.faults.snapshot(), REFUSE_CONNECTIONS: refuse_ms},
                    background=BackgroundTask(gate.refuse_for, refuse_ms / 1000),
                )
        return JSONResponse({"faults": server.faults.snapshot()})

    async def sim_reset(request: Request) -> Response:
        server.records.reset()
        server.clear_prefix_cache()
        return JSONResponse({"reset": True})

    async def http_error(request: Request, exc: Exception) -> Response:
        # FastAPI's shape, as vLLM answers an unknown path or method.
        assert isinstance(exc, HTTPException)
        return JSONResponse({"detail": exc.detail}, exc.status_code, headers=exc.headers)

    app = Starlette(
        exception_handlers={HTTPException: http_error},
        routes=[
            Route("/v1/chat/completions", generation("chat"), methods=["POST"]),
            Route("/v1/completions", generation("completions"), methods=["POST"]),
            Route("/v1/responses", generation("responses"), methods=["POST"]),
            Route("/v1/responses/{response_id}", stored_response, methods=["GET"]),
            Route("/v1/responses/{response_id}/cancel", stored_response, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics_text, methods=["GET"]),
            Route("/sim/requests", sim_requests, methods=["GET"]),
            Route("/sim/faults", sim_faults, methods=["GET", "POST", "DELETE"]),
            Route("/sim/reset", sim_reset, methods=["POST"]),
        ],
    )
    return Availability(app, server.faults)


def _permission(created: int) -> dict[str, Any]:
    """The ``permission`` entry vLLM lists under each model."""
    return {
        "id": f"modelperm-{uuid.uuid4().hex[:16]}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
