"""OpenTelemetry spans for a call's request, its attempts (claim, run, finish) and its record.

Spans carry the idempotency key (`dex.idempotency_key`), the effect class (`dex.effect_class`)
and, where known, the outcome (`dex.outcome`). When the `opentelemetry` package is missing or no
SDK tracer provider has been installed (`trace.set_tracer_provider(...)`), `span()` returns one
shared do-nothing context manager: the hot path pays a function call and an attribute check,
nothing more (measured with `bench.throughput`, see the README).

A call's spans (`dex.request` of one session's calls, `dex.attempt`) also name its session,
`dex.session_id`, and, when the deployment says where its web app is (`web_base_url`), the
session's page, `dex.session_url`: from a trace a person goes to the session as one story
(docs/operations.md, "The session timeline").

Usage: `with span("dex.attempt", key=..., effect=...) as s: ...; s.set("outcome", "succeeded")`.
Attribute names given as keywords are prefixed with `dex.`.

One trace per call, across processes: the trace context travels as a *carrier*, a small dict of
the propagator's headers (W3C `traceparent`, and `tracestate` when there is one), made by
`carrier()` from the current span with OpenTelemetry's propagator API. The dispatcher puts it in
the Celery message's headers and keeps the request's with the call in SQL (`trace_context`, for
the retries and records the sweeper makes later, outside any span of the request); the worker
reads it back from the task's request (`from_request`) and opens the attempt's span as a child
of it; the outcome writer opens each call's `dex.record.call` span as a child of its attempt's
span, linked to the batch's `dex.record` span. Without an SDK `carrier()` is None and nothing is
added to a message.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from dex_celery.model.links import session_url

try:  # defers an optional dependency: the `otel` extra
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - the core runs without it
    _trace = None  # type: ignore[assignment]
    _propagate = None  # type: ignore[assignment]

#: A trace context as the propagator's headers (`traceparent`, `tracestate`, ...).
Carrier = Mapping[str, str]

#: Instrumentation scope of every span dex-celery makes.
TRACER_NAME = "dex_celery"

#: Span names, one per step of a call's life.
REQUEST = "dex.request"
ATTEMPT = "dex.attempt"
CLAIM = "dex.attempt.claim"
RUN = "dex.attempt.run"
FINISH = "dex.attempt.finish"
RECORD = "dex.record"
#: One per call inside a `dex.record` span that wrote a batch of outcomes.
RECORD_CALL = "dex.record.call"

#: Short attribute names used as keywords -> the span attribute they set.
_NAMES = {
    "key": "dex.idempotency_key",
    "effect": "dex.effect_class",
    "outcome": "dex.outcome",
}


class Span:
    """What `span()` yields: set attributes on the live span (or on nothing)."""

    __slots__ = ("_span",)

    def __init__(self, otel_span: Any = None) -> None:
        self._span = otel_span

    @property
    def live(self) -> bool:
        """True when tracing is on: worth computing an attribute that costs a round trip."""
        return self._span is not None

    def set(self, name: str, value: Any) -> None:
        if self._span is not None and value is not None:
            self._span.set_attribute(_NAMES.get(name, f"dex.{name}"), _value(value))

    def error(self, text: str) -> None:
        """Mark the span as an error (a failed tool, an unknown outcome)."""
        if self._span is not None and _trace is not None:
            self._span.set_status(_trace.Status(_trace.StatusCode.ERROR, text[:500]))

    def __enter__(self) -> Span:
        return self

    def __exit__(self, *_: object) -> None:
        return None


#: The one do-nothing span: no allocation per call when tracing is off.
_NOOP = Span()


def name_session(traced: Span, session_id: str, base_url: str | None) -> None:
    """Name the call's session on its span: `dex.session_id`, and `dex.session_url` (its page
    on the web app) when `base_url` is known. Nothing is computed while tracing is off."""
    if traced.live:
        traced.set("session_id", session_id)
        traced.set("session_url", session_url(base_url, session_id))


def _value(value: Any) -> Any:
    if isinstance(value, bool | int | float | str):
        return value
    return str(getattr(value, "value", value))


#: A provider given to `configure()`; None means the global one (`trace.set_tracer_provider`).
_provider: Any = None


def configure(provider: Any) -> None:
    """Use this tracer provider for dex-celery's spans instead of the global one (None: back to
    the global). For embedding and tests; production sets the global provider as usual."""
    global _provider
    _provider = provider


def enabled() -> bool:
    """True once an SDK tracer provider is installed (the API's default provider is a proxy
    that records nothing)."""
    if _provider is not None:
        return True
    if _trace is None:
        return False
    provider = _trace.get_tracer_provider()
    return not isinstance(provider, _trace.ProxyTracerProvider | _trace.NoOpTracerProvider)


def span(
    name: str, parent: Carrier | None = None, **attributes: Any
) -> AbstractContextManager[Span]:
    """A span named `name` with `dex.*` attributes, current for the `with` block.

    `parent`: a carrier of the span's parent (another process's, or the one kept with the call);
    without one, or if it holds no valid context, the current span is the parent. A span given a
    parent while another span is current is linked to that one.
    """
    if not enabled():
        return _NOOP
    return _live(name, parent, attributes)


@contextmanager
def _live(name: str, parent: Carrier | None, attributes: dict[str, Any]) -> Iterator[Span]:
    assert _trace is not None and _propagate is not None
    tracer = _trace.get_tracer(TRACER_NAME, tracer_provider=_provider)
    context = None
    links = None
    if parent:
        extracted = _propagate.extract(parent)
        if _trace.get_current_span(extracted).get_span_context().is_valid:
            context = extracted
            current = _trace.get_current_span().get_span_context()
            links = [_trace.Link(current)] if current.is_valid else None
    with tracer.start_as_current_span(name, context=context, links=links) as otel_span:
        live = Span(otel_span)
        for attr, value in attributes.items():
            live.set(attr, value)
        yield live


def active() -> bool:
    """True inside a live span of this thread (whose context `carrier()` would hand on)."""
    if _trace is None or not enabled():
        return False
    return bool(_trace.get_current_span().get_span_context().is_valid)


def carrier() -> dict[str, str] | None:
    """The current span's context as the propagator's headers; None without a live span (and
    always None without an SDK: nothing is added to a message)."""
    if not active():
        return None
    assert _propagate is not None
    headers: dict[str, str] = {}
    _propagate.inject(headers)
    return headers or None


def from_request(request: Any) -> dict[str, str] | None:
    """The carrier a Celery task's message brought: its headers named by the propagator
    (Celery hands a message's own headers to the task as attributes of `task.request`, or, in
    some versions, in `task.request.headers`)."""
    if _propagate is None or request is None:
        return None
    found = {}
    nested = getattr(request, "headers", None)  # where some Celery versions keep them
    for name in _propagate.get_global_textmap().fields:
        value = getattr(request, name, None)
        if value is None and isinstance(nested, Mapping):
            value = nested.get(name)
        if isinstance(value, str) and value:
            found[name] = value
    return found or None


def dumps(context: Carrier | None) -> str | None:
    """A carrier as stored with the call (JSON text), None for none."""
    return json.dumps(dict(context), sort_keys=True, separators=(",", ":")) if context else None


def loads(text: str | None) -> dict[str, str] | None:
    """A stored carrier back (None for none or for text that is not one: tracing never fails a
    call)."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    return {str(k): str(v) for k, v in value.items()} or None


def recorded(outcomes: Iterable[tuple[str, Any, Carrier | None]]) -> None:
    """A `dex.record.call` span per call of a batch written in one transaction (key, outcome,
    the carrier of the attempt that decided it): a child of that attempt's span, in the call's
    trace, linked to the batch's `dex.record` span."""
    for key, outcome, parent in outcomes:
        with span(RECORD_CALL, parent, key=key, outcome=outcome):
            pass
