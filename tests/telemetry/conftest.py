"""What the tracing tests share: spans recorded in memory while a test runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from router.telemetry import tracing


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    traces = tracing.Tracing(SimpleSpanProcessor(exporter)).start()
    try:
        yield exporter
    finally:
        traces.shutdown()
