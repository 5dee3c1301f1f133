"""One trace per call across processes: the request's trace context travels in the Celery
message (W3C `traceparent` in its headers) and is kept with the call for the attempts and
records made later by someone else (the sweeper), so the request span in the requesting process,
each attempt's span in a real prefork worker and the record spans share one trace id with
correct parent links (docs/operations.md, "Tracing").

The test process traces with the SDK's in-memory exporter; the worker, a separate process,
writes its finished spans as JSON lines to a file (`tests.support.apps.span_file`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from devtools.processes import CeleryWorker, wait_for
from devtools.toolapp import LOG_ENV
from dex_celery import CallStatus, Dex
from dex_celery.engine import tracing
from tests.support.apps.span_file import SPANS_ENV, read_spans

WEB_BASE_URL = "https://dex.example.com/ops/"


@pytest.fixture
def env(env: dict[str, str]) -> dict[str, str]:
    """Attempts wait for the worker this test starts after its sweeps (not expired meanwhile);
    the web app's address names each call's session page on its spans (S13.6)."""
    return {**env, "DEX_SCHEDULE_TO_START": "120", "DEX_WEB_BASE_URL": WEB_BASE_URL}


@pytest.fixture
def memory() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure(provider)
    yield exporter
    tracing.configure(None)
    provider.shutdown()


def here(memory: InMemorySpanExporter, name: str, key: str) -> list[ReadableSpan]:
    return [
        s
        for s in memory.get_finished_spans()
        if s.name == name and (s.attributes or {}).get("dex.idempotency_key") == key
    ]


def ids(span: ReadableSpan) -> tuple[str, str]:
    """(trace id, span id) in the W3C hex form the worker's file uses."""
    context = span.get_span_context()
    assert context is not None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def there(spans: list[dict[str, Any]], name: str, key: str) -> list[dict[str, Any]]:
    return [
        s for s in spans if s["name"] == name and s["attributes"].get("dex.idempotency_key") == key
    ]


def test_request_attempts_and_records_form_one_trace(
    dex: Dex, env: dict[str, str], tmp_path: Path, memory: InMemorySpanExporter
) -> None:
    spans_file = tmp_path / "worker-spans.jsonl"
    client = dex.client()
    # Published by the sweeper, later: attempt 1 of a read is claimed by a worker that vanishes;
    # its lease lapses and the sweeper publishes attempt 2 outside any span of the request.
    swept = client.request_call("tp", "t1", "swept", "echo", {"x": 2})
    assert dex.ledger.claim(swept.key, 1, owner="gone:1", fence="f1").ok
    # Recorded by the sweeper: a write whose worker vanished ends outcome_unknown.
    lost = client.request_call("tp", "t1", "lost", "slow_non_idempotent_write", {"seconds": 1})
    assert dex.ledger.claim(lost.key, 1, owner="gone:2", fence="f2").ok
    assert dex.store.claim_write(lost.key, 1, fence="f2", owner="gone:2", now=dex.ledger.now())

    def sweep() -> bool:
        dex.sweeper.sweep_once()
        entry = dex.ledger.read(swept.key)
        moved = entry is not None and entry.attempt == 2
        return moved and client.get_call(lost.key).status is CallStatus.OUTCOME_UNKNOWN

    wait_for(
        sweep, timeout=30, what="the sweeper to retry one call and end the other", interval=0.2
    )

    worker = CeleryWorker(
        "tests.support.apps.traced_toolapp",
        {**env, SPANS_ENV: str(spans_file)},
        Path(env[LOG_ENV]),
        concurrency=2,
    ).start()
    main_pid = worker.pid
    try:
        ok = client.request_call("tp", "t1", "ok", "echo", {"x": 1})
        # A retry the worker publishes: attempt 1 fails, attempt 2 succeeds.
        flaky = client.request_call("tp", "t1", "flaky", "flaky_read", {"fail_times": 1})
        ended = client.wait([ok.key, flaky.key, swept.key], timeout=60)
        assert {r.status for r in ended} == {CallStatus.SUCCEEDED}, ended

        def recorded() -> bool:
            keys = {s["attributes"].get("dex.idempotency_key") for s in read_spans(spans_file)
                    if s["name"] == tracing.RECORD_CALL}  # fmt: skip
            return {ok.key, flaky.key, swept.key} <= keys

        wait_for(recorded, timeout=30, what="the worker's record spans")
    finally:
        worker.stop()
    spans = read_spans(spans_file)

    # The first attempt: its span in the worker is a child of the request span here.
    (request,) = here(memory, tracing.REQUEST, ok.key)
    trace_id, request_id = ids(request)
    (attempt,) = there(spans, tracing.ATTEMPT, ok.key)
    assert attempt["pid"] not in (
        main_pid,
        os.getpid(),
    )  # a pool child, another process than this one
    assert (attempt["trace_id"], attempt["parent_span_id"]) == (trace_id, request_id)
    (record,) = there(spans, tracing.RECORD_CALL, ok.key)
    assert (record["trace_id"], record["parent_span_id"]) == (trace_id, attempt["span_id"])
    assert record["attributes"]["dex.outcome"] == "succeeded"
    # From the trace to the session as one story: its id, and its page on the web app.
    page = "https://dex.example.com/ops/sessions/tp"
    for attributes in (request.attributes or {}, attempt["attributes"]):
        assert (attributes["dex.session_id"], attributes["dex.session_url"]) == ("tp", page)

    # A retry the worker published: attempt 2 continues the trace from attempt 1.
    (request,) = here(memory, tracing.REQUEST, flaky.key)
    trace_id, request_id = ids(request)
    first, second = sorted(there(spans, tracing.ATTEMPT, flaky.key),
                           key=lambda s: s["attributes"]["dex.attempt"])  # fmt: skip
    assert (first["trace_id"], first["parent_span_id"]) == (trace_id, request_id)
    assert (second["trace_id"], second["parent_span_id"]) == (trace_id, first["span_id"])
    (record,) = there(spans, tracing.RECORD_CALL, flaky.key)
    assert (record["trace_id"], record["parent_span_id"]) == (trace_id, second["span_id"])

    # A retry the sweeper published: the context kept with the call, the request's own.
    (request,) = here(memory, tracing.REQUEST, swept.key)
    trace_id, request_id = ids(request)
    by_attempt = {
        s["attributes"]["dex.attempt"]: s for s in there(spans, tracing.ATTEMPT, swept.key)
    }
    assert (by_attempt[2]["trace_id"], by_attempt[2]["parent_span_id"]) == (trace_id, request_id)
    assert by_attempt[2]["attributes"]["dex.outcome"] == "succeeded"
    if 1 in by_attempt:  # the stale message of attempt 1, refused at the claim
        assert by_attempt[1]["trace_id"] == trace_id

    # An outcome the sweeper recorded: its record span is in the request's trace.
    (request,) = here(memory, tracing.REQUEST, lost.key)
    trace_id, request_id = ids(request)
    (record_here,) = here(memory, tracing.RECORD, lost.key)
    assert ids(record_here)[0] == trace_id
    assert (
        record_here.parent is not None and format(record_here.parent.span_id, "016x") == request_id
    )
    assert (record_here.attributes or {})["dex.outcome"] == "outcome_unknown"
