"""OpenTelemetry spans for a call's request, its attempts (claim, run, finish) and its record.

Spans carry the idempotency key (`dex.idempotency_key`), the effect class (`dex.effect_class`)
and, where known, the outcome (`dex.outcome`). When the `opentelemetry` package is missing or no
SDK tracer provider has been installed (`trace.set_tracer_provider(...)`), `span()` returns one
shared do-nothing context manager: the hot path pays a function call and an attribute check,
nothing more (measured with `bench.throughput`, see the README).

Usage: `with span("dex.attempt", key=..., effect=...) as s: ...; s.set("outcome", "succeeded")`.
Attribute names given as keywords are prefixed with `dex.`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

try:  # defers an optional dependency: the `otel` extra
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - the core runs without it
    _trace = None  # type: ignore[assignment]

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


def span(name: str, **attributes: Any) -> AbstractContextManager[Span]:
    """A span named `name` with `dex.*` attributes, current for the `with` block."""
    if not enabled():
        return _NOOP
    return _live(name, attributes)


@contextmanager
def _live(name: str, attributes: dict[str, Any]) -> Iterator[Span]:
    assert _trace is not None
    tracer = _trace.get_tracer(TRACER_NAME, tracer_provider=_provider)
    with tracer.start_as_current_span(name) as otel_span:
        live = Span(otel_span)
        for attr, value in attributes.items():
            live.set(attr, value)
        yield live


def recorded(outcomes: Iterable[tuple[str, Any]]) -> None:
    """A `dex.record.call` span per call of a batch written in one transaction (key, outcome)."""
    for key, outcome in outcomes:
        with span(RECORD_CALL, key=key, outcome=outcome):
            pass
