"""The trace context as a carrier (engine/tracing.py): nothing without a live span, the W3C
headers with one, read back from a Celery request either way Celery keeps them, and stored
text that is not a carrier never fails a call."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import TracerProvider

from dex_celery.engine import tracing


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    provider = TracerProvider()
    tracing.configure(provider)
    yield provider
    tracing.configure(None)
    provider.shutdown()


def test_no_sdk_no_carrier() -> None:
    assert not tracing.enabled()
    assert tracing.carrier() is None and not tracing.active()
    with tracing.span(tracing.REQUEST, {"traceparent": "junk"}) as s:
        assert not s.live and tracing.carrier() is None


def test_a_live_span_gives_its_w3c_context(provider: TracerProvider) -> None:
    assert tracing.carrier() is None  # enabled, but no span is current
    with tracing.span(tracing.REQUEST):
        carrier = tracing.carrier()
    assert carrier is not None
    version, trace_id, span_id, flags = carrier["traceparent"].split("-")
    assert (version, len(trace_id), len(span_id)) == ("00", 32, 16)
    assert int(flags, 16) & 1  # sampled
    assert tracing.loads(tracing.dumps(carrier)) == carrier


def test_a_child_continues_the_carried_trace(provider: TracerProvider) -> None:
    with tracing.span(tracing.REQUEST):
        carrier = tracing.carrier()
    assert carrier is not None
    for request in (
        SimpleNamespace(**carrier),  # Celery's message headers as request attributes
        SimpleNamespace(headers=dict(carrier)),  # or nested in `request.headers`
    ):
        given = tracing.from_request(request)
        assert given == carrier
        with tracing.span(tracing.ATTEMPT, given):
            child = tracing.carrier()
        assert child is not None
        assert child["traceparent"].split("-")[1] == carrier["traceparent"].split("-")[1]
        assert child["traceparent"].split("-")[2] != carrier["traceparent"].split("-")[2]


@pytest.mark.parametrize("text", [None, "", "not json", "[1, 2]", "{}"])
def test_stored_text_that_is_no_carrier_is_none(text: str | None) -> None:
    assert tracing.loads(text) is None


def test_an_invalid_carrier_leaves_the_current_span_the_parent(provider: TracerProvider) -> None:
    with tracing.span(tracing.REQUEST):
        outer = tracing.carrier()
        with tracing.span(tracing.RECORD, {"traceparent": "00-bad"}):
            inner = tracing.carrier()
    assert outer is not None and inner is not None
    assert inner["traceparent"].split("-")[1] == outer["traceparent"].split("-")[1]
