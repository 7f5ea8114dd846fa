"""Traces: off unless the OTEL_* variables ask, one per request with a span per stage, the
client's traceparent as parent, and the request's context on the calls made upstream."""

from __future__ import annotations

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from router.config import ConfigError, UpstreamsConfig
from router.telemetry import tracing
from router.upstream import Upstreams
from router.upstream.failures import Target
from router.upstream.httpx_transport import HttpxTransport
from router.upstream.timeouts import Timeouts

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = "00f067aa0ba902b7"


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {span.name: span for span in exporter.get_finished_spans()}


def test_tracing_is_off_without_the_otel_variables() -> None:
    assert tracing.from_environment({}) is None
    assert tracing.from_environment({"OTEL_TRACES_EXPORTER": "none"}) is None
    disabled = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}
    assert tracing.from_environment(disabled) is None


def test_otlp_turns_it_on_with_the_service_name_of_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gw-east")
    traces = tracing.from_environment(
        {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    )
    assert traces is not None
    try:
        assert traces.provider.resource.attributes["service.name"] == "gw-east"
    finally:
        traces.provider.shutdown()


def test_the_default_service_name_is_the_gateways(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    traces = tracing.from_environment({"OTEL_TRACES_EXPORTER": "console"})
    assert traces is not None
    try:
        assert traces.provider.resource.attributes["service.name"] == "pd-gateway"
    finally:
        traces.provider.shutdown()


@pytest.mark.parametrize(
    "environ",
    [
        {"OTEL_TRACES_EXPORTER": "zipkin"},
        {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
    ],
)
def test_an_exporter_the_gateway_cannot_provide_is_a_configuration_error(
    environ: dict[str, str],
) -> None:
    with pytest.raises(ConfigError, match="OTEL_"):
        tracing.from_environment(environ)


def test_while_off_no_span_is_made() -> None:
    assert not tracing.enabled()
    shared = tracing.stage(tracing.PREFILL, upstream="http://x")
    assert shared is tracing.stage(tracing.ANSWER)
    assert tracing.request_span("POST", "/v1/chat/completions", []) is None
    with shared as span:
        assert span is None


def test_a_stage_is_a_child_of_the_request_and_its_failure_an_error(
    spans: InMemorySpanExporter,
) -> None:
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"
    headers = [(b"traceparent", traceparent.encode())]
    request = tracing.request_span("POST", "/v1/completions", headers)
    assert request is not None
    with request:
        with tracing.stage(tracing.VALIDATION, endpoint="completions"):
            pass
        with pytest.raises(ValueError), tracing.stage(tracing.PREFILL, upstream="http://p:1"):
            raise ValueError("refused")
    found = by_name(spans)
    root = found["POST /v1/completions"]
    assert root.parent is not None and root.parent.span_id == int(CLIENT_PARENT, 16)
    assert root.context.trace_id == int(CLIENT_TRACE, 16)
    for name in (tracing.VALIDATION, tracing.PREFILL):
        assert found[name].parent is not None
        assert found[name].parent.span_id == root.context.span_id
    assert found[tracing.VALIDATION].attributes == {"pd.endpoint": "completions"}
    prefill = found[tracing.PREFILL]
    assert prefill.attributes is not None and prefill.attributes["pd.upstream"] == "http://p:1"
    assert prefill.status.status_code is StatusCode.ERROR
    assert [event.name for event in prefill.events] == ["exception"]


def recording_upstreams(seen: list[httpx.Headers]) -> Upstreams:
    async def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return httpx.Response(200, json={})

    transport = HttpxTransport(httpx.MockTransport(handle))
    return Upstreams(UpstreamsConfig(), Timeouts(), transport=transport)


async def test_an_upstream_call_carries_the_stage_as_its_parent(
    spans: InMemorySpanExporter,
) -> None:
    seen: list[httpx.Headers] = []
    upstreams = recording_upstreams(seen)
    node = Target("TileRT node", "node-0")
    request = tracing.request_span("POST", "/v1/chat/completions", [])
    assert request is not None
    with request, tracing.stage(tracing.KV_TRANSFER, node="node-0"):
        await upstreams.call(node, "POST", "http://node:5557", "/pd/decode", read_s=1)
    await upstreams.call(node, "GET", "http://node:5557", "/health", read_s=1)
    await upstreams.aclose()
    stage = by_name(spans)[tracing.KV_TRANSFER].context
    assert seen[0]["traceparent"].startswith(f"00-{stage.trace_id:032x}-{stage.span_id:016x}-")
    assert "traceparent" not in seen[1]  # outside a request


async def test_while_off_upstream_calls_carry_no_trace_context() -> None:
    seen: list[httpx.Headers] = []
    upstreams = recording_upstreams(seen)
    node = Target("TileRT node", "node-0")
    with tracing.stage(tracing.KV_TRANSFER):
        await upstreams.call(node, "POST", "http://node:5557", "/pd/decode", read_s=1)
    await upstreams.aclose()
    assert "traceparent" not in seen[0]
