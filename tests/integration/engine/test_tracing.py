"""OpenTelemetry spans, recorded with the SDK's in-memory exporter, for one call of each outcome.

The worker runs in this process (Celery's test worker, solo pool) so its spans reach the same
exporter; Redis and SQL are real. The `outcome_unknown` call is one whose attempt was claimed
by a worker that then vanished: the sweeper finds its lease lapsed and records it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from devtools.processes import wait_for
from dex_celery import CallStatus, Dex
from dex_celery.engine import tracing


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing.configure(provider)
    yield memory
    tracing.configure(None)
    provider.shutdown()


def spans_of(exporter: InMemorySpanExporter, name: str, key: str) -> list[ReadableSpan]:
    return [
        s
        for s in exporter.get_finished_spans()
        if s.name == name and (s.attributes or {}).get("dex.idempotency_key") == key
    ]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_no_sdk_means_no_spans_and_one_shared_noop() -> None:
    assert not tracing.enabled()
    with (
        tracing.span(tracing.REQUEST, key="s/t/c") as first,
        tracing.span(tracing.RECORD) as second,
    ):
        assert first is second and not first.live


def test_spans_for_one_call_of_each_outcome(dex: Dex, exporter: InMemorySpanExporter) -> None:
    client = dex.client()
    # outcome_unknown: attempt 1 is claimed by a worker that dies before finishing (S4.3).
    lost = client.request_call("tr", "t1", "lost", "slow_non_idempotent_write", {"seconds": 1})
    assert dex.ledger.claim(lost.key, 1, owner="gone:1", fence="f1").ok
    # ... and in SQL, as a real worker does before any tool code of a write (the write fence).
    assert dex.store.claim_write(lost.key, 1, fence="f1", owner="gone:1", now=dex.ledger.now())
    sweeper = dex.sweeper

    def swept() -> bool:
        sweeper.sweep_once()
        return client.get_call(lost.key).status is CallStatus.OUTCOME_UNKNOWN

    wait_for(swept, timeout=20, what="the lost attempt to be swept", interval=0.2)

    with start_worker(dex.celery, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        ok = client.request_call("tr", "t1", "ok", "echo", {"x": 1})
        bad = client.request_call("tr", "t1", "bad", "failing", {})
        rejected = client.request_call("tr", "t1", "no", "guarded_write", {"value": 1})
        client.reject(rejected.key, "alice", "no")
        client.wait([ok.key, bad.key], timeout=30)
        assert dex.runtime.writer.flush(10)
        # The lost call's stale message reached this worker too and was refused at the claim.
        wait_for(lambda: spans_of(exporter, tracing.ATTEMPT, lost.key), timeout=10,
                 what="the stale attempt's span")  # fmt: skip

    # Requests: key, effect class and the status the call was recorded with.
    expected = {
        ok.key: ("read", "pending"),
        bad.key: ("idempotent_write", "pending"),
        rejected.key: ("non_idempotent_write", "awaiting_approval"),
        lost.key: ("non_idempotent_write", "pending"),
    }
    for key, (effect, status) in expected.items():
        (request,) = spans_of(exporter, tracing.REQUEST, key)
        assert attrs(request)["dex.effect_class"] == effect
        assert attrs(request)["dex.status"] == status

    # Attempts that ran: claim, run and finish inside the attempt, which carries the outcome.
    for key, effect, outcome in (
        (ok.key, "read", "succeeded"),
        (bad.key, "idempotent_write", "failed"),
    ):
        (attempt,) = spans_of(exporter, tracing.ATTEMPT, key)
        assert attrs(attempt)["dex.effect_class"] == effect
        assert attrs(attempt)["dex.outcome"] == outcome
        children = [s for s in exporter.get_finished_spans() if s.parent is not None
                    and s.parent.span_id == attempt.context.span_id]  # fmt: skip
        # The record of the call, written later by the outcome writer's thread, is a child of
        # the attempt too (one trace per call), linked to the batch's `dex.record` span.
        names = [tracing.CLAIM, tracing.RUN, tracing.FINISH, tracing.RECORD_CALL]
        assert [s.name for s in children] == names
        assert {attrs(s)["dex.idempotency_key"] for s in children} == {key}
        (recorded,) = spans_of(exporter, tracing.RECORD_CALL, key)
        assert attrs(recorded)["dex.outcome"] == outcome
        (link,) = recorded.links
        batches = [s for s in exporter.get_finished_spans() if s.name == tracing.RECORD]
        assert link.context.span_id in {s.context.span_id for s in batches}
    (stale,) = spans_of(exporter, tracing.ATTEMPT, lost.key)
    assert str(attrs(stale)["dex.outcome"]).startswith("claim_refused:")

    # Outcomes recorded outside a worker: the sweeper's and the rejection's.
    (unknown,) = spans_of(exporter, tracing.RECORD, lost.key)
    assert attrs(unknown)["dex.outcome"] == "outcome_unknown"
    (rejection,) = spans_of(exporter, tracing.RECORD, rejected.key)
    assert attrs(rejection)["dex.outcome"] == "rejected"
    assert spans_of(exporter, tracing.ATTEMPT, rejected.key) == []  # never ran
