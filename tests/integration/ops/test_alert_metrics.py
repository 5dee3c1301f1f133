"""The dashboard and the alert rules shipped in deploy/ name only metrics a deployment serves.

A real `dex-celery web` process and a real prefork worker with its own metrics port are scraped
after calls of the kinds the alerts watch (an `outcome_unknown` surfaced for reconciling, a call
waiting for approval, an MCP server whose fetch failed, the sweeper running); every `dex_*`
metric named in deploy/grafana/dex-celery.json and deploy/prometheus/alerts.yml must be in both
expositions, and the metrics added for the alerts must say what the records say
(docs/operations.md, "Dashboard and alerts").
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from devtools.processes import Worker, free_port, wait_for
from devtools.toolapp import executions, make_app
from dex_celery import CallStatus, Dex, Settings
from dex_celery.engine.attempt.outcome_writer import OutcomeWriter
from dex_celery.model.ids import CallKey
from dex_celery.ops.metrics import registry_for
from dex_celery.store.mcp_catalog import McpCatalog
from dex_celery.store.unknowns import UnknownOutcomes
from dex_celery.store.values import Outcome, OutcomeRow
from tests.support.web.web_process import WebServer

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "dex-celery.json"
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
TOKEN = "scrape-token-2"
_METRIC = re.compile(r"\bdex_[a-z0-9_]+")


def dashboard_metrics() -> set[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    assert exprs, "the dashboard has no queries"
    return {m for e in exprs for m in _METRIC.findall(e)}


def rule_metrics() -> set[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    exprs = [str(r["expr"]) for g in groups for r in g["rules"]]
    assert exprs, "no alert rules"
    return {m for e in exprs for m in _METRIC.findall(e)}


Exposition = tuple[set[str], dict[tuple[str, frozenset[tuple[str, str]]], float]]


def exposed(text: str) -> Exposition:
    """(every series name the exposition declares or samples, the samples)."""
    names: set[str] = set()
    samples = {}
    for family in text_string_to_metric_families(text):
        names.add(family.name + ("_total" if family.type == "counter" else ""))
        for s in family.samples:
            names.add(s.name)
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return names, samples


def scrape(url: str, token: str | None = None) -> Exposition:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    return exposed(response.text)


@pytest.fixture
def web(env: dict[str, str], dex: Dex, tmp_path: Path) -> Iterator[WebServer]:
    server = WebServer({**env, "DEX_WEB_TOKENS": f"prometheus:{TOKEN}"}, tmp_path / "web.log")
    yield server.start()
    server.stop()


@pytest.mark.usefixtures("env", "sweeper")
def test_the_dashboard_and_the_rules_name_only_served_metrics(
    dex: Dex,
    web: WebServer,
    start_worker: Callable[..., Worker],
) -> None:
    named = dashboard_metrics() | rule_metrics()
    # The metrics added for the rules are among them (the test reads something real).
    assert {
        "dex_unknown_outcome_oldest_age_seconds",
        "dex_approval_nearest_deadline_seconds",
        "dex_ledger_epoch_info",
        "dex_mcp_server_up",
        "dex_sql_write_errors_total",
        "dex_sweep_lag_seconds",
    } <= named

    client = dex.client()
    doomed = start_worker(concurrency=1)
    lost = client.request_call("m", "t1", "lost", "slow_non_idempotent_write", {"seconds": 60})
    wait_for(lambda: executions(lost.key), timeout=20, what="the slow write to start")
    doomed.kill_all()
    port = free_port()
    start_worker(extra_env={"DEX_WORKER_METRICS_PORT": str(port)})
    waiting = client.request_call("m", "t1", "waiting", "guarded_write", {"value": 3})
    client.wait([lost.key], timeout=30)
    record = dex.store.get_call(lost.key)
    assert record is not None and record.status is CallStatus.OUTCOME_UNKNOWN
    assert UnknownOutcomes(dex.store).surface(record, now=time.time())  # what reconcile does
    McpCatalog(dex.store).save_error("time", "stdio:mcp-server-time", "connection refused")

    worker_url = f"http://127.0.0.1:{port}"
    for url, token in ((web.url, TOKEN), (worker_url, None)):
        names, samples = scrape(url, token)
        assert not named - names, f"{url} lacks {sorted(named - names)}"
        now = time.time()
        age = samples[("dex_unknown_outcome_oldest_age_seconds", frozenset())]
        assert record.finished_at is not None
        assert age == pytest.approx(now - record.finished_at, abs=5)
        waiting_record = dex.store.get_call(waiting.key)
        assert waiting_record is not None and waiting_record.approval_deadline is not None
        left = samples[("dex_approval_nearest_deadline_seconds", frozenset())]
        assert left == pytest.approx(waiting_record.approval_deadline - now, abs=5)
        assert samples[("dex_mcp_server_up", frozenset({("server", "time")}))] == 0
        epoch = dex.runtime.redis.get(dex.runtime.keys.epoch)
        assert samples[("dex_ledger_epoch_info", frozenset({("shard", "0"), ("epoch", epoch)}))]
        assert samples[("dex_sweep_errors", frozenset())] == 0


def test_an_outcome_sql_refused_is_counted(dex: Dex, env: dict[str, str], tmp_path: Path) -> None:
    """The recorder's batch fails on a database that cannot be opened: the outcome is counted
    under `dex_sql_write_errors_total{writer="recorder"}` (and stays for the sweeper)."""
    gone = tmp_path / "no-such-dir" / "dex.db"
    _app, broken = make_app(Settings.from_env(env, database_url=f"sqlite:///{gone}"))
    writer = OutcomeWriter(broken.store, dex.runtime.ledger)
    key = CallKey.of("s", "t", "c")
    writer.submit(OutcomeRow(key, "echo", "{}", Outcome(CallStatus.SUCCEEDED, "")))
    assert writer.flush(timeout=10)

    def counted() -> float:
        _names, samples = exposed(generate(dex))
        return samples.get(("dex_sql_write_errors_total", frozenset({("writer", "recorder")})), 0.0)

    assert counted() == 1


def generate(dex: Dex) -> str:
    return generate_latest(registry_for(dex)).decode()
