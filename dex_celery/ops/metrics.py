"""Prometheus metrics, computed at scrape time from SQL and Redis.

A Celery worker is many processes; counters kept in each process's memory would need a
multiprocess directory and would still disagree with the records after a restart. So every
value here is read when Prometheus scrapes: counts from the SQL records, gauges from the ledger's
indexes, and the two facts that exist nowhere else from Redis hashes (`dex_celery.engine.counters`). The
same collector serves the web app's `/metrics` and, optionally, a worker's own port
(`Settings.worker_metrics_port`).

Metrics (all prefixed `dex_`):

| metric | type | labels | meaning |
|---|---|---|---|
| `dex_tool_calls_total` | counter | tool, effect_class, outcome | calls that ended, by outcome |
| `dex_tool_calls_requested_total` | counter | tool, effect_class | calls recorded |
| `dex_tool_calls_open` | gauge | tool, effect_class, status | calls not ended (`pending`, `awaiting_approval`) |
| `dex_attempts_total` | counter | tool, effect_class | attempts of ended calls |
| `dex_retries_total` | counter | tool, effect_class | attempts after the first |
| `dex_claims_refused_total` | counter | reason | deliveries turned away by the claim |
| `dex_unknown_outcomes_unreported` | gauge | | `outcome_unknown` calls whose session was not told the real outcome |
| `dex_approvals_waiting` | gauge | | calls waiting for a person |
| `dex_approval_oldest_age_seconds` | gauge | | how long the oldest of them has waited |
| `dex_approval_nearest_deadline_seconds` | gauge | | time left to the soonest deadline among them (`+Inf` if none waits) |
| `dex_unknown_outcome_oldest_age_seconds` | gauge | | since when the oldest surfaced, unreported `outcome_unknown` call has waited (0 if none) |
| `dex_writes_frozen` | gauge | | write freezes in force (0: writes are not frozen; S13.2) |
| `dex_write_freeze_info` | gauge | tool, mode, frozen_by | 1 per freeze in force: its scope (`*` every tool), `hold` or `reject`, who froze |
| `dex_write_freeze_since_seconds` | gauge | tool | when each freeze in force began (Unix time, the ledger's clock) |
| `dex_mcp_server_up` | gauge | server | 1 if the last fetch of the server's tools answered, 0 if it failed |
| `dex_ledger_in_flight` | gauge | state | attempts in the ledger: `enqueued`, `running` |
| `dex_ledger_unrecorded` | gauge | | outcomes decided but not yet in SQL |
| `dex_sweep_lag_seconds` | gauge | | time since the last sweep ended |
| `dex_sweep_duration_seconds` | gauge | | how long the last sweep took |
| `dex_sweep_errors` | gauge | | items the last sweep could not move (left for the next) |
| `dex_ledger_epoch_info` | gauge | shard, epoch | 1 for each shard's current life id; a new `epoch` is a new life (a Redis rollback or loss) |
| `dex_sql_write_errors_total` | counter | writer | outcomes SQL would not take (`recorder`, `sweeper`); each waits in the ledger for the sweeper |
| `dex_webhooks_delivered_total` | counter | receiver | webhook deliveries that succeeded |
| `dex_webhooks_retries_total` | counter | receiver | failed tries that were retried |
| `dex_webhooks_given_up_total` | counter | receiver | deliveries given up after the last try |
| `dex_webhooks_pending` | gauge | | deliveries waiting to be (re)tried |
| `dex_budget_limit` | gauge | budget, scope | a write budget's limit (S13.1), per principal or deployment scope |
| `dex_budget_used` | gauge | budget, scope | reserved (admitted, not ended) plus spent in the window |
| `dex_budget_held` | gauge | budget, scope | charges of calls whose outcome is unknown, not reconciled |
| `dex_budget_left` | gauge | budget, scope | what the next call may still use |
| `dex_budget_calls_waiting` | gauge | | calls waiting for a person because a budget had too little left |
| `dex_metrics_source_up` | gauge | source | 1 if `sql` / `redis` answered this scrape |

Secret argument values never reach a metric: no label holds arguments; webhook receivers are
shown without their query string.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

# defers an optional dependency: prometheus_client (extras `web` and `metrics`)
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from dex_celery.access import Credentials, HostAllowlist, Scope, check_bind, guarded_wsgi
from dex_celery.engine import (
    CLAIMS_REFUSED,
    SQL_WRITE_ERRORS,
    last_sweep,
    stats_fields,
    with_prefix,
)
from dex_celery.model.outcomes import CallStatus
from dex_celery.ops.budgets import declared_budgets, scope_views
from dex_celery.ops.webhooks import delivery_status
from dex_celery.store.freezes import WriteFreezes
from dex_celery.store.mcp_catalog import McpCatalog
from dex_celery.store.views import OperatorViews

if TYPE_CHECKING:
    from dex_celery.engine import RuntimeSource

log = logging.getLogger("dex_celery.ops.metrics")

_TERMINAL = {s.value for s in CallStatus if s.terminal}
#: `McpServerState.state` -> `dex_mcp_server_up`; a server never fetched has no sample.
_MCP_REACHED = {"ok": 1, "unreachable": 0, "not reached": 0}


class DexCollector(Collector):
    """Reads every metric of one deployment at scrape time."""

    def __init__(self, source: RuntimeSource) -> None:
        self.source = source
        self.views = OperatorViews(source.runtime.store)

    def describe(self) -> list[Metric]:
        return []  # no collect() at registration: the first scrape is the first read

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "dex_metrics_source_up", "1 if the source answered this scrape", labels=["source"]
        )
        try:
            yield from self._sql()
            up.add_metric(["sql"], 1)
        except Exception:
            log.exception("metrics: the SQL part failed")
            up.add_metric(["sql"], 0)
        try:
            yield from self._redis()
            yield from self._budgets()
            up.add_metric(["redis"], 1)
        except Exception:
            log.exception("metrics: the Redis part failed")
            up.add_metric(["redis"], 0)
        yield up

    def _budgets(self) -> Iterator[Metric]:
        """Write budgets (S13.1): each principal and deployment scope (a session's scope is
        shown by `budgets show` and the web app: one series per session would have no end),
        and the calls waiting because of a budget."""
        source = self.source
        declared = declared_budgets(source, source.runtime.dispatcher.tools.values())
        families = {
            name: GaugeMetricFamily(f"dex_budget_{name}", text, labels=["budget", "scope"])
            for name, text in (
                ("limit", "A write budget's limit"),
                ("used", "Reserved plus spent within the window"),
                ("held", "Charges of calls whose outcome is unknown, not reconciled"),
                ("left", "What the next call may still use"),
            )
        }
        for v in scope_views(source, declared):
            if v.scope.startswith("session:"):
                continue
            for name, value in (
                ("limit", v.limit),
                ("used", v.used),
                ("held", v.held),
                ("left", v.left),
            ):
                families[name].add_metric([v.name, v.scope], float(value))
        yield from families.values()
        waiting = GaugeMetricFamily(
            "dex_budget_calls_waiting", "Calls waiting for a person because a budget was used up"
        )
        waiting.add_metric([], float(source.runtime.store.calls_waiting_for_budget()))
        yield waiting

    def _sql(self) -> Iterator[Metric]:
        pair = ["tool", "effect_class"]
        ended = CounterMetricFamily(
            "dex_tool_calls", "Tool calls that ended, by outcome", labels=[*pair, "outcome"]
        )
        requested = CounterMetricFamily(
            "dex_tool_calls_requested", "Tool calls recorded", labels=pair
        )
        still_open = GaugeMetricFamily(
            "dex_tool_calls_open", "Tool calls not ended yet", labels=[*pair, "status"]
        )
        attempts = CounterMetricFamily("dex_attempts", "Attempts of ended calls", labels=pair)
        retries = CounterMetricFamily("dex_retries", "Attempts after the first", labels=pair)
        totals: dict[tuple[str, str], list[int]] = {}
        for row in self.views.count_by_outcome():
            pair_key = (row.tool, row.effect)
            total = totals.setdefault(pair_key, [0, 0, 0])
            total[0] += row.calls
            if row.status in _TERMINAL:
                ended.add_metric([row.tool, row.effect, row.status], row.calls)
                total[1] += row.attempts
                total[2] += row.retries
            else:
                still_open.add_metric([row.tool, row.effect, row.status], row.calls)
        for (tool, effect), (calls, n_attempts, n_retries) in sorted(totals.items()):
            requested.add_metric([tool, effect], calls)
            attempts.add_metric([tool, effect], n_attempts)
            retries.add_metric([tool, effect], n_retries)
        yield from (ended, requested, still_open, attempts, retries)

        unknown = GaugeMetricFamily(
            "dex_unknown_outcomes_unreported",
            "outcome_unknown calls whose session was not told the real outcome yet",
        )
        unknown.add_metric([], self.views.count_unreported_unknowns())
        yield unknown
        now = self.source.runtime.ledger.now()
        backlog = self.views.approval_backlog(now)
        waiting = GaugeMetricFamily("dex_approvals_waiting", "Calls waiting for a person")
        waiting.add_metric([], backlog.waiting)
        oldest = GaugeMetricFamily(
            "dex_approval_oldest_age_seconds", "How long the oldest waiting call has waited"
        )
        age = 0.0 if backlog.oldest_requested_at is None else now - backlog.oldest_requested_at
        oldest.add_metric([], max(0.0, age))
        nearest = GaugeMetricFamily(
            "dex_approval_nearest_deadline_seconds",
            "Time left to the soonest approval deadline (+Inf if no call waits)",
        )
        left = math.inf if backlog.nearest_deadline is None else backlog.nearest_deadline - now
        nearest.add_metric([], max(0.0, left))
        yield from (waiting, oldest, nearest)

        unknown_age = GaugeMetricFamily(
            "dex_unknown_outcome_oldest_age_seconds",
            "Since when the oldest surfaced, unreported outcome_unknown call has waited",
        )
        ended_at = self.views.oldest_open_unknown_end()
        unknown_age.add_metric([], 0.0 if ended_at is None else max(0.0, now - ended_at))
        yield unknown_age

        yield from self._freezes()

        mcp_up = GaugeMetricFamily(
            "dex_mcp_server_up",
            "1 if the last fetch of the MCP server's tools answered, 0 if it failed",
            labels=["server"],
        )
        for name, state in sorted(McpCatalog(self.source.runtime.store).servers().items()):
            if state.state in _MCP_REACHED:
                mcp_up.add_metric([name], _MCP_REACHED[state.state])
        yield mcp_up

    def _freezes(self) -> Iterator[Metric]:
        """The write freeze (S13.2), from SQL's record: how many, by whom, since when."""
        active = WriteFreezes(lambda: self.source.runtime.store.engine).active()
        frozen = GaugeMetricFamily("dex_writes_frozen", "Write freezes in force (0: none)")
        frozen.add_metric([], len(active))
        info = GaugeMetricFamily(
            "dex_write_freeze_info",
            "1 per write freeze in force: scope, mode and who froze",
            labels=["tool", "mode", "frozen_by"],
        )
        since = GaugeMetricFamily(
            "dex_write_freeze_since_seconds",
            "When each write freeze in force began (Unix time)",
            labels=["tool"],
        )
        for f in active:
            info.add_metric([f.tool, f.mode.value, f.frozen_by], 1)
            since.add_metric([f.tool], f.since)
        yield from (frozen, info, since)

    def _redis(self) -> Iterator[Metric]:
        source, keys = self.source, self.source.runtime.keys
        refused = CounterMetricFamily(
            "dex_claims_refused", "Deliveries turned away by the claim", labels=["reason"]
        )
        fields = stats_fields(source.runtime.ledger)
        for reason, count in sorted(with_prefix(fields, CLAIMS_REFUSED).items()):
            refused.add_metric([reason], count)
        write_errors = CounterMetricFamily(
            "dex_sql_write_errors",
            "Outcomes SQL would not take (each waits in the ledger for the sweeper)",
            labels=["writer"],
        )
        for writer, count in sorted(with_prefix(fields, SQL_WRITE_ERRORS).items()):
            write_errors.add_metric([writer], count)
        yield from (refused, write_errors)

        pipe: Any = source.runtime.redis.pipeline(transaction=False)
        pipe.zcard(keys.queue_index)
        pipe.zcard(keys.lease_index)
        pipe.zcard(keys.unrecorded_index)
        shards = keys.all_shards
        for shard in shards:
            pipe.get(shard.epoch)
        enqueued, running, unrecorded, *epochs = pipe.execute()
        in_flight = GaugeMetricFamily(
            "dex_ledger_in_flight", "Attempts in the ledger", labels=["state"]
        )
        in_flight.add_metric(["enqueued"], int(enqueued))
        in_flight.add_metric(["running"], int(running))
        not_in_sql = GaugeMetricFamily(
            "dex_ledger_unrecorded", "Outcomes decided but not yet written to SQL"
        )
        not_in_sql.add_metric([], int(unrecorded))
        life = GaugeMetricFamily(
            "dex_ledger_epoch_info",
            "1 for each ledger shard's current life id (a new epoch: a Redis rollback or loss)",
            labels=["shard", "epoch"],
        )
        for shard, epoch in zip(shards, epochs, strict=True):
            if epoch is not None:  # no life yet: the first worker or sweep starts one
                life.add_metric([str(shard.index), str(epoch)], 1)
        yield from (in_flight, not_in_sql, life)

        sweep = last_sweep(source.runtime.ledger)
        if sweep is not None:
            lag = GaugeMetricFamily("dex_sweep_lag_seconds", "Time since the last sweep ended")
            lag.add_metric([], max(0.0, source.runtime.ledger.now() - sweep.finished_at))
            duration = GaugeMetricFamily(
                "dex_sweep_duration_seconds", "How long the last sweep took"
            )
            duration.add_metric([], sweep.duration)
            errors = GaugeMetricFamily(
                "dex_sweep_errors", "Items the last sweep could not move (left for the next)"
            )
            errors.add_metric([], sweep.errors)
            yield from (lag, duration, errors)

        hooks = delivery_status(source)
        delivered = CounterMetricFamily(
            "dex_webhooks_delivered", "Webhook deliveries that succeeded", labels=["receiver"]
        )
        retried = CounterMetricFamily(
            "dex_webhooks_retries", "Failed webhook tries that were retried", labels=["receiver"]
        )
        given_up = CounterMetricFamily(
            "dex_webhooks_given_up", "Webhook deliveries given up", labels=["receiver"]
        )
        for receiver in hooks.receivers:
            delivered.add_metric([receiver.receiver], receiver.delivered)
            retried.add_metric([receiver.receiver], receiver.retries)
            given_up.add_metric([receiver.receiver], receiver.given_up)
        pending = GaugeMetricFamily("dex_webhooks_pending", "Webhook deliveries waiting")
        pending.add_metric([], hooks.pending)
        yield from (delivered, retried, given_up, pending)


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape on the worker's stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def registry_for(source: RuntimeSource) -> CollectorRegistry:
    """A registry holding only dex-celery's collector (no process metrics of the scraper)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DexCollector(source))
    return registry


def serve_worker_metrics(
    source: RuntimeSource, open_paths: Mapping[str, Callable[..., Any]] | None = None
) -> None:
    """Start the worker's own endpoint on `Settings.worker_metrics_port` (Celery `worker_init`).

    It runs in the worker's main process only, so one port per worker host process. It is a
    network door like the web app's `/metrics` (docs/security.md): it listens on
    `worker_metrics_host` (loopback by default; beyond loopback only with credentials), answers
    only allowed `Host` names, and with credentials configured asks for a token or person with
    the scope `metrics`. Raises `ConfigurationError` for an open bind beyond loopback.
    `open_paths` (the worker's `/readyz` and `/livez`, `processes.health`) answer after the
    `Host` check without credentials.
    """
    port = source.runtime.settings.worker_metrics_port
    if not port:
        return
    host = source.runtime.settings.worker_metrics_host
    credentials = Credentials.from_settings(source.runtime.settings)
    check_bind(host, credentials, "the worker's metrics port")
    app = guarded_wsgi(
        make_wsgi_app(registry_for(source)),
        credentials,
        HostAllowlist.from_settings(source.runtime.settings).with_bind(host),
        Scope.METRICS,
        open_paths=open_paths,
    )

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    httpd = make_server(host.strip("[]"), port, app, Server, handler_class=_QuietHandler)
    threading.Thread(target=httpd.serve_forever, name="dex-metrics", daemon=True).start()
    log.info("Prometheus metrics on %s port %d", host, port)
