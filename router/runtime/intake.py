"""A client's request as the gateway takes it in: parsed, held to the limits, validated (a
Responses call becoming the chat request it asks), its model found, then classified.

The live gateway (`router.http.dispatch`) and `pd-gateway classify` both go through here,
so that what `classify` explains is what the gateway decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies import Decision
from router.errors import ModelNotFound
from router.openai.endpoints import EndpointSpec
from router.openai.limits import check_limits, check_token_ids, strip_transfer_params
from router.openai.requests import (
    ChatRequest,
    CompletionRequest,
    ResponsesRequest,
    parse_body,
    validate,
)
from router.openai.responses_input import chat_body
from router.runtime.epoch import ConfigEpoch
from router.runtime.models import ModelRuntime


@dataclass(frozen=True, slots=True)
class Intake:
    """A request ready to classify."""

    endpoint: EndpointSpec
    parsed: ChatRequest | CompletionRequest
    body: dict[str, Any]
    """What the gateway works on (for a Responses call, the chat request it translates to)."""
    client_body: dict[str, Any] | None
    """The client's body, when `body` is a translation of it."""
    model: ModelRuntime


def take_in(epoch: ConfigEpoch, raw: bytes, endpoint: EndpointSpec) -> Intake:
    """Raises InvalidRequest or ModelNotFound (a 400 or 404 for the client)."""
    body = parse_body(raw)
    check_limits(body, epoch.config.limits)
    strip_transfer_params(body)
    parsed = validate(endpoint.request, body)
    client_body = None
    if isinstance(parsed, ResponsesRequest):
        client_body, body = body, chat_body(parsed, body)
        parsed = validate(ChatRequest, body)
    model = epoch.models.get(parsed.model)
    if model is None:
        shown = parsed.model if len(parsed.model) <= 100 else parsed.model[:100] + "…"
        raise ModelNotFound(f"the model '{shown}' does not exist", param="model")
    check_token_ids(body, model.vocab_size)
    return Intake(endpoint, parsed, body, client_body, model)


async def decide(
    epoch: ConfigEpoch,
    intake: Intake,
    *,
    headers: Mapping[str, str],
    api_key_name: str | None,
    tenant: str | None = None,
) -> Decision:
    """`api_key_name`: the caller's verified key name (see `router.runtime.auth`)."""
    return await epoch.classifier.decide(
        intake.body,
        endpoint=intake.endpoint.name,
        headers=headers,
        api_key_name=api_key_name,
        tenant=tenant,
    )
