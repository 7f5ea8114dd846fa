"""A client's request as the gateway takes it in: parsed, held to the limits, validated (a
Responses call becoming the chat request it asks), its model found, then classified.

The live gateway (`router.http.dispatch`) and `pd-gateway classify` both go through here,
so that what `classify` explains is what the gateway decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
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
from router.selection import Load, parse_load, scrape_once
from router.serving import RoutedRequest, new_request_id
from router.upstream import Upstreams, vllm


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
) -> Decision:
    """`api_key_name`: the caller's verified key name (see `router.runtime.auth`)."""
    return await epoch.classifier.decide(
        intake.body,
        endpoint=intake.endpoint.name,
        headers=headers,
        api_key_name=api_key_name,
    )


async def explain_plan(
    epoch: ConfigEpoch,
    intake: Intake,
    decision: Decision,
    *,
    headers: Mapping[str, str],
    probe: Upstreams | None = None,
) -> tuple[list[str], dict[str, str]]:
    """For a decision with an objective, each way's prediction and the choice, as
    `pd-gateway classify` prints them: the timings the model's `objectives` settings assume
    (what a running gateway has learned is its own), on an idle deployment; with `probe`,
    the servers' load as their `/metrics` report it (asked through `probe`) and, on a shared
    pool, its queue. Also the headers the plan adds to the answer."""
    model = intake.model
    lines = [
        "timings: as models[].objectives assumes them"
        f" (prefill {model.config.objectives.prefill_ms_per_token} ms/token,"
        f" itl {model.config.objectives.itl_ms} ms"
        f" + {model.config.objectives.itl_ms_per_running} ms per running request,"
        f" node itl {model.config.objectives.tilert_itl_ms} ms,"
        f" hand-off {model.config.objectives.handoff_ms} ms)"
    ]
    node_wait_s: float | None = 0.0
    if probe is not None:
        await scrape_once(model.server_sets(), partial(_load, probe), interval_s=60.0)
        shared = epoch.config.gate.backend == "redis"
        node_wait_s = None if shared else 0.0
        lines.append(
            "signals: the servers' load as their /metrics report it; "
            + (
                "the pool's queue from Redis"
                if shared
                else "the pool idle (its queue is the gateway's own)"
            )
        )
    else:
        lines.append("signals: assumed idle (no request in flight, no node busy, nothing cached)")
    routed = RoutedRequest(
        intake.endpoint,
        intake.parsed,
        intake.body,
        decision,
        new_request_id(),
        {},
        client_body=intake.client_body,
        client_headers=headers,
    )
    plan = await model.objective.plan(routed, node_wait_s=node_wait_s)
    return lines + plan.explain(), routed.headers


async def _load(upstreams: Upstreams, url: str) -> Load | None:
    text = await vllm.metrics_text(upstreams, url)
    return None if text is None else parse_load(text)
