"""`/metrics` scraped before and after calls of every outcome: each counter moves as it should.

Real `dex-celery web` process (scraped with a bearer token), real prefork workers (one of them
SIGKILLed mid-write for an `outcome_unknown`), real redis-server, the sweeper running. The
worker's own metrics port serves the same numbers, read from the same records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools.processes import Worker, free_port, wait_for
from devtools.toolapp import executions
from dex_celery import CallStatus, Dex
from dex_celery.engine.steps import AttemptMessage
from tests.support.web.web_process import WebServer

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
TOKEN = "scrape-token-1"


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def web(env: dict[str, str], dex: Dex, tmp_path: Path) -> Iterator[WebServer]:
    server = WebServer({**env, "DEX_WEB_TOKENS": f"prometheus:{TOKEN}"}, tmp_path / "web.log")
    yield server.start()
    server.stop()


def scrape(url: str, token: str | None = TOKEN) -> Samples:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    return parse(response.text)


@pytest.mark.usefixtures("env", "sweeper")
def test_every_counter_moves_with_calls_of_each_outcome(
    dex: Dex,
    web: WebServer,
    start_worker: Callable[..., Worker],
) -> None:
    assert (
        httpx.get(f"{web.url}/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
    )
    before = scrape(web.url)
    assert value(before, "dex_metrics_source_up", source="sql") == 1
    assert value(before, "dex_metrics_source_up", source="redis") == 1
    assert not [k for k in before if k[0] == "dex_tool_calls_total"]

    client = dex.client()
    # outcome_unknown: a non-idempotent write whose worker is SIGKILLed mid-run (S4.3).
    doomed = start_worker(concurrency=1)
    lost = client.request_call("m", "t1", "lost", "slow_non_idempotent_write", {"seconds": 60})
    wait_for(lambda: executions(lost.key), timeout=20, what="the slow write to start")
    running = scrape(web.url)
    assert value(running, "dex_ledger_in_flight", state="running") == 1
    doomed.kill_all()

    start_worker()
    ok = client.request_call("m", "t1", "ok", "echo", {"x": 1})
    flaky = client.request_call("m", "t1", "flaky", "flaky_read", {"fail_times": 1})
    bad = client.request_call("m", "t1", "bad", "failing", {})
    approved = client.request_call("m", "t1", "approved", "guarded_write", {"value": 1})
    rejected = client.request_call("m", "t1", "rejected", "guarded_write", {"value": 2})
    waiting = client.request_call("m", "t1", "waiting", "guarded_write", {"value": 3})
    client.approve(approved.key, "alice")
    client.reject(rejected.key, "bob", "no")
    keys = [lost.key, ok.key, flaky.key, bad.key, approved.key, rejected.key]
    client.wait(keys, timeout=30)
    # A redelivered message of a finished attempt: the claim turns it away without running it.
    message = AttemptMessage("echo", ok.key, {"x": 1}, ok.policy)
    dex.runtime.steps.publish(message, attempt=1)

    def refused() -> bool:
        return value(scrape(web.url), "dex_claims_refused_total", reason="finished") == 1

    wait_for(refused, timeout=20, what="the refused claim to be counted")
    assert len(executions(ok.key)) == 1

    after = scrape(web.url)
    statuses = {r.key: r.status for r in client.get_agent_snapshot("m").tool_calls}
    assert statuses[lost.key] is CallStatus.OUTCOME_UNKNOWN
    assert statuses[waiting.key] is CallStatus.AWAITING_APPROVAL

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    calls = "dex_tool_calls_total"
    assert delta(calls, tool="echo", effect_class="read", outcome="succeeded") == 1
    assert delta(calls, tool="flaky_read", effect_class="read", outcome="succeeded") == 1
    assert delta(calls, tool="failing", effect_class="idempotent_write", outcome="failed") == 1
    write = {"tool": "guarded_write", "effect_class": "non_idempotent_write"}
    assert delta(calls, **write, outcome="succeeded") == 1
    assert delta(calls, **write, outcome="rejected") == 1
    assert delta(
        calls, tool="slow_non_idempotent_write", effect_class="non_idempotent_write",
        outcome="outcome_unknown",
    ) == 1  # fmt: skip
    assert sum(v for (n, _), v in after.items() if n == calls) == 6
    assert delta("dex_tool_calls_requested_total", **write) == 3
    assert value(after, "dex_tool_calls_open", **write, status="awaiting_approval") == 1
    assert delta("dex_attempts_total", tool="flaky_read", effect_class="read") == 2
    assert delta("dex_retries_total", tool="flaky_read", effect_class="read") == 1
    assert delta("dex_attempts_total", tool="echo", effect_class="read") == 1
    assert delta("dex_retries_total", tool="echo", effect_class="read") == 0
    assert delta("dex_claims_refused_total", reason="finished") == 1
    assert value(after, "dex_unknown_outcomes_unreported") == 1
    assert value(after, "dex_approvals_waiting") == 1
    assert value(after, "dex_approval_oldest_age_seconds") > 0
    assert value(after, "dex_ledger_in_flight", state="running") == 0
    assert value(after, "dex_ledger_in_flight", state="enqueued") == 0
    assert 0 <= value(after, "dex_sweep_lag_seconds") < 5
    assert 0 < value(after, "dex_sweep_duration_seconds") < 5

    # Approving the last one moves it from waiting to succeeded.
    client.approve(waiting.key, "alice")
    client.wait([waiting.key], timeout=30)
    final = scrape(web.url)
    assert value(final, "dex_approvals_waiting") == 0
    assert value(final, calls, **write, outcome="succeeded") == 2

    # The worker's own port: the same numbers from the same records.
    port = free_port()
    start_worker(extra_env={"DEX_WORKER_METRICS_PORT": str(port)})
    from_worker = parse(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
    assert {k: v for k, v in from_worker.items() if k[0] == calls} == {
        k: v for k, v in final.items() if k[0] == calls
    }
