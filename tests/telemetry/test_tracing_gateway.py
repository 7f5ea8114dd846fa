"""Traces of whole requests: the gateway in process, its upstreams simulated (real processes):
one trace per request with a span per stage, the client's traceparent as its parent, and the
stage's context on what vLLM receives."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from router.config import parse_config
from router.http.app import create_app
from router.telemetry import tracing
from sim.stack import SimStack
from tests.support.deployment import (
    gateway_config,
    latency_model,
    sim_get,
    sim_post,
    version_args,
)
from tests.support.stacks import StackPool

pytestmark = pytest.mark.e2e

MODEL = "sim-pull"
PROXIED = "sim-proxied"
PUSHED = "sim-push"
VERSION = "0.1.6"
RULES = {
    "default": {"name": "native", "path": "throughput"},
    "rules": [{"name": "fast", "match": {"headers": {"x-workload": "fast"}}, "path": "latency"}],
}
FAST = {"x-workload": "fast"}
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    version = version_args(VERSION)
    return sim_stacks.get(
        nodes=1,
        prefills=1,
        decodes=1,
        proxy=True,
        model=[MODEL, PROXIED, PUSHED],
        node_args=["--step-ms", "1", *version["node_args"]],
        prefill_args=["--itl-ms", "0", "--prefill-ms-per-token", "0", *version["prefill_args"]],
        decode_args=["--itl-ms", "0", "--prefill-ms-per-token", "0"],
        proxy_args=["--itl-ms", "0", "--prefill-ms-per-token", "0"],
    )


@pytest.fixture
async def gateway(stack: SimStack, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    assert stack.proxy is not None
    prefill, decode = stack.prefills[0], stack.decodes[0]
    models = [
        latency_model(
            stack,
            MODEL,
            tilert=VERSION,
            continuations=0,  # a broken stream ends as an error
            throughput={"mode": "pull", "prefill": [prefill.url], "decode": [decode.url]},
        ),
        {
            "name": PROXIED,
            "tokenizer": "deepseek",
            "throughput": {"mode": "proxy", "urls": [stack.proxy.url]},
        },
    ]
    engine = {
        "url": prefill.url,
        "engine_id": prefill.engine_id,
        "side_channel_host": prefill.side_channel_host,
        "side_channel_port": prefill.side_channel_port,
    }
    push = {"mode": "push", "prefill": [engine], "decode": [decode.url]}
    models.append({"name": PUSHED, "tokenizer": "deepseek", "throughput": push})
    document = gateway_config(models, classification={"rules": RULES})
    app = create_app(parse_config(document, base_dir=tmp_path))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield client


def chat(model: str, *, stream: bool = False) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 4,
        "stream": stream,
    }


def tree(exporter: InMemorySpanExporter) -> tuple[ReadableSpan, dict[str, ReadableSpan]]:
    """The request's span and its stages by name; every span is of one trace."""
    finished = exporter.get_finished_spans()
    roots = [s for s in finished if s.name.startswith("POST ")]
    assert len(roots) == 1
    root = roots[0]
    assert {s.context.trace_id for s in finished} == {root.context.trace_id}
    return root, {s.name: s for s in finished if s is not root}


def parent_of(span: ReadableSpan) -> int:
    assert span.parent is not None
    return span.parent.span_id


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def last_request(url: str) -> dict[str, Any]:
    """The last generation request a simulated vLLM server received."""
    requests: list[dict[str, Any]] = sim_get(url, "/sim/requests")["requests"]
    return requests[-1]


def traceparent_of(span: ReadableSpan) -> str:
    return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}"


async def test_a_latency_stream_is_one_trace_under_the_clients_parent(
    gateway: httpx.AsyncClient, stack: SimStack, spans: InMemorySpanExporter
) -> None:
    headers = {**FAST, "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"}
    response = await gateway.post(
        "/v1/chat/completions", json=chat(MODEL, stream=True), headers=headers
    )
    assert response.status_code == 200
    assert b"data: [DONE]" in response.content
    root, stages = tree(spans)
    assert root.name == "POST /v1/chat/completions"
    assert root.context.trace_id == int(CLIENT_TRACE, 16)
    assert parent_of(root) == int(CLIENT_PARENT, 16)
    node = stack.nodes[0]
    assert attributes(root) | {
        "pd.model": MODEL,
        "pd.path": "latency",
        "pd.rule": "fast",
        "pd.node": f"{node.host}:{node.http_port}",
        "pd.prefill": stack.prefills[0].url,
        "http.response.status_code": 200,
    } == attributes(root)
    assert set(stages) == {
        tracing.VALIDATION,
        tracing.CLASSIFICATION,
        tracing.QUEUE_WAIT,
        tracing.PREFILL,
        tracing.KV_TRANSFER,
        tracing.ANSWER,
    }
    assert all(parent_of(s) == root.context.span_id for s in stages.values())
    assert attributes(stages[tracing.CLASSIFICATION])["pd.path"] == "latency"
    assert attributes(stages[tracing.QUEUE_WAIT])["pd.node"] == f"{node.host}:{node.http_port}"
    assert attributes(stages[tracing.PREFILL])["pd.upstream"] == stack.prefills[0].url
    assert attributes(stages[tracing.KV_TRANSFER])["pd.upstream"] == node.url
    assert root.status.status_code is StatusCode.UNSET
    seen = last_request(stack.prefills[0].url)
    assert seen["headers"]["traceparent"].startswith(traceparent_of(stages[tracing.PREFILL]))


async def test_pull_legs_are_stages_and_vllm_gets_each_legs_context(
    gateway: httpx.AsyncClient, stack: SimStack, spans: InMemorySpanExporter
) -> None:
    response = await gateway.post("/v1/chat/completions", json=chat(MODEL))
    assert response.status_code == 200
    root, stages = tree(spans)
    assert root.parent is None
    assert set(stages) == {
        tracing.VALIDATION,
        tracing.CLASSIFICATION,
        tracing.PREFILL,
        tracing.DECODE,
        tracing.ANSWER,
    }
    assert all(parent_of(s) == root.context.span_id for s in stages.values())
    assert attributes(root)["pd.path"] == "throughput"
    assert attributes(stages[tracing.DECODE])["pd.upstream"] == stack.decodes[0].url
    prefilled = last_request(stack.prefills[0].url)
    decoded = last_request(stack.decodes[0].url)
    assert prefilled["headers"]["traceparent"].startswith(traceparent_of(stages[tracing.PREFILL]))
    assert decoded["headers"]["traceparent"].startswith(traceparent_of(stages[tracing.DECODE]))


async def test_push_legs_run_side_by_side_under_the_request(
    gateway: httpx.AsyncClient, stack: SimStack, spans: InMemorySpanExporter
) -> None:
    response = await gateway.post("/v1/chat/completions", json=chat(PUSHED, stream=True))
    assert response.status_code == 200
    root, stages = tree(spans)
    assert {tracing.PREFILL, tracing.DECODE, tracing.ANSWER} <= set(stages)
    assert all(parent_of(s) == root.context.span_id for s in stages.values())
    decoded = last_request(stack.decodes[0].url)
    assert decoded["headers"]["traceparent"].startswith(traceparent_of(stages[tracing.DECODE]))


async def test_a_failing_upstream_marks_its_stage_and_the_request_as_errors(
    gateway: httpx.AsyncClient, stack: SimStack, spans: InMemorySpanExporter
) -> None:
    assert stack.proxy is not None
    sim_post(stack.proxy.url, "/sim/faults", {"http_status": 503, "count": 1})
    response = await gateway.post("/v1/chat/completions", json=chat(PROXIED))
    assert response.status_code >= 500
    root, stages = tree(spans)
    assert root.status.status_code is StatusCode.ERROR
    assert stages[tracing.PROXY].status.status_code is StatusCode.ERROR


async def test_a_stream_the_node_breaks_ends_its_answer_and_the_request_as_errors(
    gateway: httpx.AsyncClient, stack: SimStack, spans: InMemorySpanExporter
) -> None:
    sim_post(stack.nodes[0].url, "/sim/faults", {"error_after": 2, "count": 1})
    body = chat(MODEL, stream=True)
    response = await gateway.post("/v1/chat/completions", json=body, headers=FAST)
    assert response.status_code == 200
    assert b'"error"' in response.content
    root, stages = tree(spans)
    assert stages[tracing.KV_TRANSFER].status.status_code is StatusCode.UNSET
    answer = stages[tracing.ANSWER]
    assert answer.status.status_code is StatusCode.ERROR
    assert [event.name for event in answer.events] == ["exception"]
    assert root.status.status_code is StatusCode.ERROR
    assert "pd.error_code" in attributes(root)


async def test_a_client_error_ends_validation_with_an_error_and_the_request_is_a_4xx(
    gateway: httpx.AsyncClient, spans: InMemorySpanExporter
) -> None:
    response = await gateway.post("/v1/chat/completions", json={"model": MODEL, "messages": 3})
    assert response.status_code == 400
    root, stages = tree(spans)
    assert set(stages) == {tracing.VALIDATION}
    assert stages[tracing.VALIDATION].status.status_code is StatusCode.ERROR
    assert attributes(root)["http.response.status_code"] == 400
    assert root.status.status_code is StatusCode.UNSET


async def test_with_tracing_off_no_span_is_made_and_vllm_gets_no_traceparent(
    gateway: httpx.AsyncClient, stack: SimStack
) -> None:
    exporter = InMemorySpanExporter()
    tracing.Tracing(SimpleSpanProcessor(exporter)).start().shutdown()
    response = await gateway.post("/v1/chat/completions", json=chat(MODEL), headers=FAST)
    assert response.status_code == 200
    assert exporter.get_finished_spans() == ()
    assert not tracing.enabled()
    seen = last_request(stack.prefills[0].url)
    assert "traceparent" not in seen["headers"]


class Collector(ThreadingHTTPServer):
    """An OTLP/HTTP receiver that keeps the trace exports it is sent."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ExportHandler)
        self.exports: list[ExportTraceServiceRequest] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def spans(self) -> list[tuple[str, str]]:
        """(service name, span name) of every span received."""
        found = []
        for export in self.exports:
            for resource_spans in export.resource_spans:
                service = next(
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                )
                for scope_spans in resource_spans.scope_spans:
                    found += [(service, span.name) for span in scope_spans.spans]
        return found


class _ExportHandler(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        if self.path == "/v1/traces":
            self.server.exports.append(ExportTraceServiceRequest.FromString(body))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


async def test_the_otel_variables_turn_tracing_on_for_the_apps_life(
    stack: SimStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collector: Collector
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gw-under-test")
    models = [latency_model(stack, MODEL, tilert=VERSION)]
    app = create_app(parse_config(gateway_config(models), base_dir=tmp_path))
    async with app.router.lifespan_context(app):
        assert tracing.enabled()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            response = await client.post("/v1/chat/completions", json=chat(MODEL))
        assert response.status_code == 200
    # The app's end flushed what was queued.
    assert not tracing.enabled()
    received = collector.spans()
    assert {service for service, _ in received} == {"gw-under-test"}
    names = {name for _, name in received}
    assert {"POST /v1/chat/completions", tracing.PREFILL, tracing.KV_TRANSFER} <= names
