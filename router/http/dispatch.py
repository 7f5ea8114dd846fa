"""From an HTTP request to the path that serves it: parse, validate, classify, serve.

What happens on saturation or a failure before the first byte (queue, spill, reject) is
the paths' business (`router.serving.Fallback`); nothing here depends on the path.
"""

from __future__ import annotations

from functools import partial

from fastapi import Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from policies import Decision
from policies.decision import REROUTE_HEADER
from router.errors import ClientGone, GatewayError, InvalidRequest
from router.openai.endpoints import EndpointSpec
from router.runtime.intake import decide, take_in
from router.runtime.state import AppState
from router.serving import PathResponse, RoutedRequest, new_request_id
from router.telemetry import tracing
from router.telemetry.access import AccessRecord
from router.tenants.admission import NodeUse
from router.tenants.identity import tenant_of


class Dispatcher:
    def __init__(self, state: AppState) -> None:
        self._state = state

    async def handle(self, request: Request, endpoint: EndpointSpec) -> Response:
        state = self._state
        current = state.epoch  # one configuration for the whole request
        key_name = current.keys.client.key_name(request.headers)
        access: AccessRecord = request.state.access
        access.key_name = key_name
        _check_content_type(request.headers.get("content-type"))
        raw = await _read_body(request, current.config.server.max_body_bytes)
        with tracing.stage(tracing.VALIDATION, endpoint=endpoint.name):
            intake = take_in(current, raw, endpoint)
        parsed, model = intake.parsed, intake.model
        access.model, access.stream = parsed.model, parsed.stream
        tenants = state.tenants
        user = intake.body.get("user")
        access.tenant = tenant = tenant_of(
            tenants.config,
            key_name=key_name,
            headers=request.headers,
            user=user if isinstance(user, str) else None,
        )
        with tracing.stage(tracing.CLASSIFICATION, model=parsed.model, tenant=tenant):
            decision = await decide(
                current, intake, headers=request.headers, api_key_name=key_name, tenant=tenant
            )
            tracing.annotate(path=decision.path, rule=decision.rule)
        headers = decision.response_headers()
        if decision.reroute_reason is not None:
            state.metrics.reroute(parsed.model, decision.reroute_reason.value, spill=False)
        path = model.objective if decision.objective is not None else model.paths.get(decision.path)
        if decision.unavailable is not None or path is None:
            error = _unavailable(decision)
            error.headers = {**headers, **error.headers}
            raise error
        tokens = decision.prompt_tokens_estimate() + (parsed.token_budget or 0)
        try:
            admitted = await tenants.admit(
                tenant, tokens, model=parsed.model, node_use=_node_use(decision)
            )
        except GatewayError as error:
            error.headers = {**headers, **error.headers}
            raise
        headers.update(admitted.headers)
        access.upstream_request_id = new_request_id()
        routed = RoutedRequest(
            endpoint,
            parsed,
            intake.body,
            decision,
            access.upstream_request_id,
            headers,
            access,
            intake.client_body,
            request.headers,
            share=admitted.share,
            nodes_refused=admitted.nodes_refused,
            on_node_released=(
                partial(tenants.node_released, admitted) if admitted.node_quota else None
            ),
        )
        learning = model.objective.learning(routed)

        def ended() -> None:
            learning()
            tenants.answered(admitted, access, routed.headers.get(REROUTE_HEADER))

        routed.on_end = ended
        return PathResponse(path, routed, state.live, state.metrics.in_flight(decision.path))


def _node_use(decision: Decision) -> NodeUse:
    """Whether the request may hold a TileRT node: an objective's tilert way is one of its
    ways; a fixed latency rule's node is its only one (what a spill does is no plan)."""
    if decision.objective is not None:
        if "tilert" not in decision.ways:
            return "none"
        return "only" if tuple(decision.ways) == ("tilert",) else "maybe"
    return "only" if decision.path == "latency" else "none"


def _unavailable(decision: Decision) -> GatewayError:
    reason = decision.reroute_reason.value if decision.reroute_reason else decision.unavailable
    return InvalidRequest(
        f"this model has no {decision.path} path, which the request needs ({reason})",
        param=reason,
        code=decision.unavailable,
    )


def _check_content_type(value: str | None) -> None:
    """JSON or nothing (clients that send no type mean JSON, as FastAPI assumes). Another
    type is a 400, as vLLM answers it."""
    if value is None:
        return
    media = value.split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise InvalidRequest(
            f"the request body must be JSON (Content-Type: application/json), not {media[:100]!r}",
            code="unsupported_media_type",
        )


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        # Refused unread; the connection closes rather than read the rest.
        raise _too_large(limit, f"declares {int(declared)} bytes (Content-Length)")
    chunks = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit, f"exceeds {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone("the client left before sending its whole request") from None
    return b"".join(chunks)


def _too_large(limit: int, what: str) -> InvalidRequest:
    return InvalidRequest(
        f"the request body {what}; at most {limit} bytes are accepted (server.max_body_bytes)",
        status=413,
        code="request_too_large",
        headers={"connection": "close"},
    )
