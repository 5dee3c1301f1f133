"""Is this deployment working? The checks behind `dex-celery status` and the worker's warnings.

Each section is one function `(RuntimeSource) -> Section`, listed in `SECTIONS`. A section that cannot
be computed reports `fail` with the reason instead of raising, so one dead service never hides
the others.

The sweeper leaves a heartbeat in Redis after every sweep (`record_sweep`); a sweep older than
`STALE_SWEEPS` intervals (`stale_after`) means beat is not running the sweeper (or nothing runs beat): expired
calls would stay `pending` for ever, so both `status` and the workers say so.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from sqlalchemy import inspect

from dex_celery.backend_errors import first_line, require_existing_database, translate
from dex_celery.engine import (
    SILENT_WINDOW,
    WorkerStart,
    read_starts,
)
from dex_celery.engine import (
    last_sweep as recorded_sweep,
)
from dex_celery.model.times import format_utc
from dex_celery.ops import webhooks
from dex_celery.ops.present import celery_line, command_line
from dex_celery.store.freezes import WriteFreezes
from dex_celery.store.mcp_catalog import McpCatalog, McpServerState
from dex_celery.store.repository import Store
from dex_celery.store.schema import tool_calls
from dex_celery.store.views import OperatorViews

if TYPE_CHECKING:
    from dex_celery.engine import RuntimeSource

log = logging.getLogger("dex_celery.ops.status")

#: A sweep heartbeat older than this many sweep intervals counts as "no sweeper"...
STALE_SWEEPS = 5
#: ...and never younger than this many seconds (a beat restart is not an outage).
STALE_FLOOR = 5.0


def stale_after(sweep_interval: float) -> float:
    """Seconds without a sweep after which the sweeper counts as not running."""
    return max(STALE_SWEEPS * sweep_interval, STALE_FLOOR)


#: Seconds `status` waits for the workers' `inspect stats` replies.
PING_TIMEOUT = 1.0


class State(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class Section:
    """One line of the report: a name, a state, a sentence, and values for `--json`."""

    name: str
    state: State
    detail: str
    values: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.state.value, "detail": self.detail, **self.values}


@dataclass(frozen=True, slots=True)
class HealthReport:
    sections: tuple[Section, ...]

    @property
    def failed(self) -> list[Section]:
        return [s for s in self.sections if s.state is State.FAIL]

    @property
    def warnings(self) -> list[Section]:
        return [s for s in self.sections if s.state is State.WARN]

    def as_dict(self) -> dict[str, Any]:
        overall = State.FAIL if self.failed else State.WARN if self.warnings else State.OK
        return {"state": overall.value, "sections": {s.name: s.as_dict() for s in self.sections}}


SectionCheck = Callable[["RuntimeSource"], Section]


def _guarded(name: str, check: SectionCheck, source: RuntimeSource) -> Section:
    try:
        return check(source)
    except Exception as e:
        error = translate(
            e,
            redis_url=source.runtime.settings.redis_url,
            database_url=source.runtime.settings.database_url,
        )
        return Section(name, State.FAIL, first_line(error or e))


# --- last sweep ----------------------------------------------------------------------------


def last_sweep(source: RuntimeSource) -> tuple[float | None, float]:
    """(seconds since the last sweep, or None if none is recorded; now on the ledger's clock)."""
    now = source.runtime.ledger.now()
    sweep = recorded_sweep(source.runtime.ledger)
    if sweep is None:
        return None, now
    return max(0.0, now - sweep.finished_at), now


def sweep_section(source: RuntimeSource, app: str | None = None) -> Section:
    """`app`: the app as the person named it, for the commands the hints show."""
    interval = source.runtime.settings.sweep_interval
    age, _now = last_sweep(source)
    limit = stale_after(interval)
    if age is None:
        return Section(
            "last_sweep",
            State.WARN,
            "no sweep has ever run: schedule it with app.conf.beat_schedule = dex.beat_schedule() "
            f"and run `{celery_line(app, 'beat')}` (or `{command_line(app, 'sweep', '--loop')}`)",
            {"age_seconds": None, "interval_seconds": interval},
        )
    values = {"age_seconds": round(age, 3), "interval_seconds": interval}
    if age > limit:
        return Section(
            "last_sweep",
            State.WARN,
            f"the last sweep was {age:.0f}s ago (interval {interval:g}s): is "
            f"`{celery_line(app, 'beat')}` running with dex.beat_schedule()? Expired calls stay "
            "pending until it does",
            values,
        )
    return Section("last_sweep", State.OK, f"{age:.1f}s ago (interval {interval:g}s)", values)


# --- the sections --------------------------------------------------------------------------------


def redis_section(source: RuntimeSource) -> Section:
    source.runtime.redis.ping()
    info = source.runtime.redis.info("server")
    version = str(info.get("redis_version", "?"))
    return Section("redis", State.OK, f"answers (Redis {version})", {"version": version})


def database_section(source: RuntimeSource, app: str | None = None) -> Section:
    """`app`: the app as the person named it, for the command the hints show."""
    from dex_celery.store.migrate import (  # deferred: Alembic is slow to import
        current,
        head,
        knows,
    )

    settings = source.runtime.settings
    require_existing_database(settings.database_url)
    at, newest = current(settings.database_url, settings.database_schema), head()
    values = {"revision": at, "head": newest, "schema": settings.database_schema}
    if at is None:
        if _has_tables(source):
            return Section(
                "database",
                State.WARN,
                "has dex-celery's tables but no migration revision (made by create_schema()): "
                f"run `{command_line(app, 'db', 'upgrade')}` to adopt them",
                values,
            )
        return Section(
            "database",
            State.FAIL,
            f"answers but has no dex-celery schema: run `{command_line(app, 'db', 'upgrade')}`",
            values,
        )
    if at != newest and not knows(at):
        return Section(
            "database",
            State.WARN,
            f"schema at revision {at}, newer than this code's {newest}: a newer release "
            "migrated it (expand-then-contract keeps this code working; upgrade this process "
            "next: docs/deploy.md)",
            values,
        )
    if at != newest:
        return Section(
            "database",
            State.WARN,
            f"schema at revision {at}, the code expects {newest}: run "
            f"`{command_line(app, 'db', 'upgrade')}`",
            values,
        )
    return Section("database", State.OK, f"schema at revision {at} (newest)", values)


def _has_tables(source: RuntimeSource) -> bool:
    with source.runtime.store.engine.connect() as conn:
        names = inspect(conn).get_table_names(schema=source.runtime.settings.database_schema)
    return tool_calls.name in names


def workers_section(source: RuntimeSource) -> Section:
    """The workers that answer (Celery's `inspect stats`: node, main pid, uptime), with how
    often each node name was started (`worker_starts`: restarts by a supervisor show there),
    and the recorded nodes that did not answer."""
    replies: dict[str, Any] = (
        source.runtime.celery.control.inspect(timeout=PING_TIMEOUT).stats() or {}
    )
    starts = _worker_starts(source)
    now = source.runtime.ledger.now() if starts else 0.0
    nodes = sorted(replies)
    workers: dict[str, dict[str, Any]] = {}
    shown: list[str] = []
    for node in nodes:
        stats = replies[node] if isinstance(replies[node], dict) else {}
        start = starts.get(node)
        info = {
            "pid": stats.get("pid"),
            "uptime_seconds": stats.get("uptime"),
            "starts": start.starts if start else None,
            "restarts": start.restarts if start else None,
        }
        workers[node] = info
        parts = [f"pid {info['pid']}"] if info["pid"] is not None else []
        if info["uptime_seconds"] is not None:
            parts.append(f"up {duration(float(info['uptime_seconds']))}")
        if start is not None and start.restarts:
            parts.append(f"restarted {start.restarts} time{'s' if start.restarts != 1 else ''}")
        shown.append(f"{node} ({', '.join(parts)})" if parts else node)
    silent = {
        node: round(max(0.0, now - start.started_at), 3)
        for node, start in sorted(starts.items())
        if node not in replies and now - start.started_at <= SILENT_WINDOW
    }
    values = {"nodes": nodes, "workers": workers, "silent": silent}
    if not nodes:
        detail = "no worker answered"
        if silent:
            detail += "; last seen starting: " + _silent_text(silent)
        return Section("workers", State.WARN, detail, values)
    detail = ", ".join(shown)
    if silent:
        detail += "; not answering: " + _silent_text(silent)
    return Section("workers", State.OK, detail, values)


def _worker_starts(source: RuntimeSource) -> dict[str, WorkerStart]:
    try:
        return read_starts(source)
    except Exception:  # the broker answered; a Redis hiccup must not hide the workers
        log.debug("could not read the workers' starts", exc_info=True)
        return {}


def _silent_text(silent: dict[str, float]) -> str:
    return ", ".join(f"{node} (started {duration(age)} ago)" for node, age in silent.items())


def duration(seconds: float) -> str:
    """`42s`, `5m`, `3h`, `2d`: the largest unit that fits."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def calls_section(source: RuntimeSource) -> Section:
    """The same counts as `/metrics` (`store.views.OperatorViews`, one query each)."""
    runtime = source.runtime
    require_existing_database(runtime.settings.database_url)  # reading never creates a file
    views = OperatorViews(runtime.store)
    in_flight = views.count_in_flight()
    try:
        now = runtime.ledger.now()
    except Exception:  # Redis away: the SQL counts still answer, by this host's clock
        now = time.time()
    waiting = views.approval_backlog(now).waiting
    unreported = views.count_unreported_unknowns()
    state = State.WARN if unreported else State.OK
    return Section(
        "calls",
        state,
        f"{in_flight} in flight, {waiting} waiting for approval, "
        f"{unreported} outcome_unknown not reported",
        {"in_flight": in_flight, "awaiting_approval": waiting, "unknown_unreported": unreported},
    )


def writes_section(source: RuntimeSource) -> Section:
    """The write freeze (S13.2), from SQL's record: frozen warns, naming by whom, since when
    and why; with a thaw it is ok again."""
    runtime = source.runtime
    require_existing_database(runtime.settings.database_url)  # reading never creates a file
    active = WriteFreezes(lambda: runtime.store.engine).active()
    if not active:
        return Section("writes", State.OK, "not frozen", {"frozen": []})
    return Section(
        "writes",
        State.WARN,
        "; ".join(f.line() for f in active),
        {"frozen": [f.as_dict() for f in active]},
    )


def webhooks_section(source: RuntimeSource) -> Section:
    """Webhook deliveries: a receiver that gave deliveries up, or has some waiting, warns."""
    status = webhooks.delivery_status(source)
    given_up = sum(r.given_up for r in status.receivers)
    state = State.WARN if given_up or status.pending else State.OK
    detail = webhooks.render_status(status).splitlines()[0]
    if given_up:
        detail += f"; {given_up} given up"
    return Section("webhooks", state, detail, status.as_dict())


def mcp_server_states(store: Store, names: Sequence[str]) -> list[dict[str, Any]]:
    """Each registered MCP server's kept state, in `names` order (from the database only: no
    server is started); a server never fetched nor tried has no row and shows so."""
    kept = McpCatalog(store).servers(list(names))
    states = []
    for name in names:
        state = kept.get(name)
        states.append(
            state.as_json()
            if state is not None
            else McpServerState(name, "", None, None, None, None).as_json()
        )
    return states


def mcp_section(source: RuntimeSource, names: Sequence[str]) -> Section:
    """MCP servers: one unreachable, never fetched, or with a changed tool definition warns
    (never fails: only calls of its own tools are affected)."""
    states = mcp_server_states(source.runtime.store, names)
    parts = []
    for state in states:
        text = f"{state['name']} {state['state']}"
        if state["tools"] is not None:
            text += f", {state['tools']} tools fetched {format_utc(state['fetched_at'])}"
        if state["changed"]:
            text += f", changed: {', '.join(state['changed'])}"
        if state["last_error"] and state["state"] != "ok":
            text += f", last error: {first_line(state['last_error'])}"
        parts.append(text)
    worry = any(s["state"] != "ok" or s["changed"] for s in states)
    return Section(
        "mcp_servers", State.WARN if worry else State.OK, "; ".join(parts), {"servers": states}
    )


#: The report's sections, in order.
SECTIONS: tuple[tuple[str, SectionCheck], ...] = (
    ("redis", redis_section),
    ("database", database_section),
    ("workers", workers_section),
    ("last_sweep", sweep_section),
    ("calls", calls_section),
    ("writes", writes_section),
    ("webhooks", webhooks_section),
)


def health_report(
    source: RuntimeSource,
    *,
    include_workers: bool = True,
    mcp_servers: Sequence[str] = (),
    app: str | None = None,
) -> HealthReport:
    """Every section in order; the workers are not pinged through a broker known to be down
    (Kombu would retry the connection for seconds). `mcp_servers` (names) adds their section,
    read from the database. `app` (as the person named it with `-A`) goes into the commands
    the hints show, so they run as pasted."""
    sections: list[Section] = []
    hinted: dict[str, SectionCheck] = {
        "database": lambda s: database_section(s, app),
        "last_sweep": lambda s: sweep_section(s, app),
    }
    for name, check in SECTIONS:
        if name == "workers" and not include_workers:
            continue
        redis_down = any(s.name == "redis" and s.state is State.FAIL for s in sections)
        if name == "workers" and redis_down and not source.runtime.settings.broker_url:
            sections.append(Section(name, State.FAIL, "not asked: the broker (Redis) is down"))
            continue
        database_down = any(s.name == "database" and s.state is State.FAIL for s in sections)
        if name in ("calls", "writes") and database_down:
            sections.append(Section(name, State.FAIL, "not asked: the database is not ready"))
            continue
        sections.append(_guarded(name, hinted.get(name, check), source))
    if mcp_servers:
        database_down = any(s.name == "database" and s.state is State.FAIL for s in sections)
        if database_down:
            sections.append(
                Section("mcp_servers", State.WARN, "not asked: the database is not ready")
            )
        else:
            sections.append(_guarded("mcp_servers", lambda s: mcp_section(s, mcp_servers), source))
    return HealthReport(tuple(sections))


# --- warnings in the worker's log ------------------------------------------------------------------


class DeploymentWatch:
    """In a worker's main process: warn at start if the schema is missing, and whenever the
    sweeper has not run for `STALE_SWEEPS` intervals (once per stale spell)."""

    def __init__(self, source: RuntimeSource) -> None:
        self.source = source
        self._stop = threading.Event()
        self._stale = False

    def start(self) -> None:
        database = _guarded("database", database_section, self.source)
        if database.state is not State.OK:
            log.warning("dex-celery: the database is not ready: %s", database.detail)
        threading.Thread(target=self._loop, name="dex-deployment-watch", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def check_sweeper(self) -> Section:
        section = _guarded("last_sweep", sweep_section, self.source)
        stale = section.state is not State.OK
        if stale and not self._stale:
            log.warning("dex-celery: no sweeper is running: %s", section.detail)
        elif self._stale and not stale:
            log.info("dex-celery: the sweeper runs again (%s)", section.detail)
        self._stale = stale
        return section

    def _loop(self) -> None:
        period = stale_after(self.source.runtime.settings.sweep_interval)
        # Give beat a full window to start before the first verdict.
        while not self._stop.wait(period):
            self.check_sweeper()
