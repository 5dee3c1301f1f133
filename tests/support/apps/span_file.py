"""An OpenTelemetry span exporter that appends each finished span as one JSON line to a file.

A worker process started by a test installs it (`install`, from `tests.support.apps.traced_toolapp`)
so the test can read the spans that process and its prefork children made: the parent links of
one trace across processes are then checked against the test's own in-memory spans. Each span
is one `write` to a file opened for appending, so lines from several processes do not mix.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

#: Set in a worker's environment: the file its spans are appended to.
SPANS_ENV = "DEX_TEST_SPANS_FILE"


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def span_line(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": _hex(context.trace_id, 32),
        "span_id": _hex(context.span_id, 16),
        "parent_span_id": _hex(span.parent.span_id, 16) if span.parent is not None else None,
        "links": [_hex(link.context.span_id, 16) for link in span.links],
        "attributes": {k: v for k, v in (span.attributes or {}).items()},
        "pid": os.getpid(),
    }


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        text = "".join(json.dumps(span_line(s), default=str) + "\n" for s in spans)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS


def install() -> None:
    """Make the SDK the global tracer provider when `SPANS_ENV` names a file (before the pool
    forks: the simple processor has no thread, so every child inherits a working one)."""
    path = os.environ.get(SPANS_ENV)
    if not path:
        return
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(Path(path))))
    trace.set_tracer_provider(provider)


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
