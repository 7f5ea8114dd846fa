"""OpenTelemetry traces: one per API request, a span per stage it goes through.

Off unless the standard `OTEL_*` variables turn it on (`OTEL_TRACES_EXPORTER=otlp` or
`console`); `OTEL_SDK_DISABLED=true` keeps it off. The SDK itself reads the rest: the
exporter's endpoint, headers and protocol (`OTEL_EXPORTER_OTLP_*`), the service name and
resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), the sampler
(`OTEL_TRACES_SAMPLER`), the batching (`OTEL_BSP_*`), the propagators (`OTEL_PROPAGATORS`).

While tracing is off, `request_span` answers None and `stage` one shared do-nothing
context manager: no span object is made for a request. A stage the client's departure
cancels is not an error.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from opentelemetry import trace
from opentelemetry.propagate import extract
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from router.config.errors import ConfigError
from router.telemetry.access import AccessRecord

SCOPE = "pd_gateway"
DEFAULT_SERVICE_NAME = "pd-gateway"

# Stage names, one per span under a request's span.
VALIDATION = "validation"
CLASSIFICATION = "classification"
QUEUE_WAIT = "queue_wait"
PREFILL = "prefill"
KV_TRANSFER = "kv_transfer"
DECODE = "decode"
CONTINUATION = "continuation"
PROXY = "proxy"
ANSWER = "answer"

_OFF: AbstractContextManager[None] = nullcontext()
_tracer: Tracer | None = None


class Tracing:
    """This process's tracer provider, while tracing is on."""

    def __init__(self, processor: SpanProcessor, resource: Resource | None = None) -> None:
        self.provider = TracerProvider(resource=resource or _resource())
        self.provider.add_span_processor(processor)

    def start(self) -> Tracing:
        global _tracer
        _tracer = self.provider.get_tracer(SCOPE)
        return self

    def shutdown(self) -> None:
        """Stop tracing; the spans still queued are exported first."""
        global _tracer
        _tracer = None
        self.provider.shutdown()


def from_environment(environ: Mapping[str, str]) -> Tracing | None:
    """The tracing the `OTEL_*` variables ask for, not yet started; None: off.
    Raises ConfigError for an exporter or protocol the gateway cannot provide."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",")]
    names = [n for n in names if n and n != "none"]
    if not names:
        return None
    exporters = [_exporter(name, environ) for name in names]
    tracing = Tracing(BatchSpanProcessor(exporters[0]))
    for exporter in exporters[1:]:
        tracing.provider.add_span_processor(BatchSpanProcessor(exporter))
    return tracing


def enabled() -> bool:
    return _tracer is not None


def request_span(
    method: str, path: str, headers: Iterable[tuple[bytes, bytes]]
) -> AbstractContextManager[Span] | None:
    """The span of one API request, current until it ends; a client's `traceparent` is its
    parent. None while tracing is off."""
    tracer = _tracer
    if tracer is None:
        return None
    carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers}
    return tracer.start_as_current_span(
        f"{method} {path}",
        context=extract(carrier),
        kind=SpanKind.SERVER,
        attributes={"http.request.method": method, "url.path": path},
    )


def stage(name: str, **attributes: str | int | float | bool | None) -> AbstractContextManager[Any]:
    """A stage of the current request, as a span under the current one. A stage that raises
    ends with an error status and the exception recorded."""
    tracer = _tracer
    if tracer is None:
        return _OFF
    return _stage(tracer, name, attributes)


@contextmanager
def _stage(tracer: Tracer, name: str, attributes: dict[str, Any]) -> Iterator[Span]:
    known = {f"pd.{k}": v for k, v in attributes.items() if v is not None}
    with tracer.start_as_current_span(name, attributes=known) as span:
        yield span


def annotate(**attributes: str | int | float | bool | None) -> None:
    """Attributes learnt during a stage, on its span (nothing while tracing is off)."""
    if _tracer is None:
        return
    span = trace.get_current_span()
    for key, value in attributes.items():
        if value is not None:
            span.set_attribute(f"pd.{key}", value)


def upstream_answered(status: int) -> None:
    """The upstream's status, on the current stage: a 5xx makes it an error."""
    if _tracer is None:
        return
    span = trace.get_current_span()
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR, f"the upstream answered {status}"))


def failed(error: BaseException) -> None:
    """An error the current stage answers rather than raises (a stream's last event): the
    stage ends as an error, with the exception recorded."""
    if _tracer is None:
        return
    span = trace.get_current_span()
    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, str(error)))


def finish_request(span: Span, record: AccessRecord) -> None:
    """What the request's access record says, on its span: the model, the path, the node
    and servers it went to, its status (a stream's is its error event's, as in the access
    line); a 5xx is an error."""
    for key in ("model", "path", "rule", "node", "prefill", "upstream", "error_code"):
        if (value := getattr(record, key)) is not None:
            span.set_attribute(f"pd.{key}", value)
    span.set_attribute("pd.request_id", record.request_id)
    if record.stream is not None:
        span.set_attribute("pd.stream", record.stream)
    if record.status is not None:
        span.set_attribute("http.response.status_code", record.status)
    if record.status is not None and record.status >= 500:
        span.set_status(Status(StatusCode.ERROR, record.error_code))


def _resource() -> Resource:
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; when neither
    # names the service, it calls it after the Python executable.
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


def _exporter(name: str, environ: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER: {name!r} is not one of otlp, console, none")
    protocol = environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    ).strip()
    if protocol in ("", "http/protobuf"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if protocol == "grpc":
        try:
            grpc = importlib.import_module("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
        except ImportError:
            raise ConfigError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the "
                "opentelemetry-exporter-otlp-proto-grpc package"
            ) from None
        exporter: SpanExporter = grpc.OTLPSpanExporter()
        return exporter
    raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not http/protobuf or grpc")
