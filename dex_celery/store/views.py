"""Read-only queries for operators: the web app's lists and the metrics' counts.

Nothing here writes. The counts are read at scrape time from SQL, so they agree across every
worker process and survive restarts (a counter kept in one process's memory would see only its
share). No read scans history: ended calls are counted in `dex_call_counts`, kept in the same
transactions that end them (`store/counts.py`); open calls are counted through the partial
indexes that hold only `pending` and `awaiting_approval` rows, so a scrape costs the same at a
thousand or a million ended calls (docs/benchmarks.md, "Scrape cost").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, func, select, union_all

from dex_celery.errors import InvalidRequest
from dex_celery.model.argument_shape import lone_surrogate
from dex_celery.model.ids import validate_id
from dex_celery.model.list_limits import check_list_limit
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ToolCallRecord
from dex_celery.store.repository import Store
from dex_celery.store.rows import call_record
from dex_celery.store.schema import call_counts, tool_calls, unknown_outcomes
from dex_celery.store.unknowns import OPEN, REPORTED, UnknownOutcome, _row

#: Most rows one search returns.
MAX_SEARCH = 500


@dataclass(frozen=True, slots=True)
class OutcomeCount:
    """Calls of one tool, effect class and status, with their attempts and retries."""

    tool: str
    effect: str
    status: str
    calls: int
    attempts: int
    retries: int


@dataclass(frozen=True, slots=True)
class ApprovalBacklog:
    waiting: int
    oldest_requested_at: float | None
    #: The soonest deadline among them (None when none waits).
    nearest_deadline: float | None = None


@dataclass(frozen=True, slots=True)
class CallSearch:
    """Filters of the calls page; every field optional."""

    session_id: str | None = None
    tool_name: str | None = None
    status: CallStatus | None = None
    since: float | None = None
    until: float | None = None
    limit: int = 100

    def __post_init__(self) -> None:
        """Refuse, as typed errors, what no call can match and a database would choke on: a
        session id that is none (a NUL: PostgreSQL refuses it in any string; a lone surrogate:
        no UTF-8), such a tool name, a limit no SQL integer holds."""
        if self.session_id is not None:
            validate_id("session id", self.session_id)
        if self.tool_name is not None and (
            "\x00" in self.tool_name or lone_surrogate(self.tool_name) is not None
        ):
            raise InvalidRequest("the tool name searched for holds a NUL or a lone surrogate")
        check_list_limit(self.limit)


@dataclass(frozen=True, slots=True)
class UnreportedUnknown:
    """An `outcome_unknown` call whose real outcome nobody has told its session yet."""

    record: ToolCallRecord
    #: None until the reconcile job has surfaced it.
    state: UnknownOutcome | None


class OperatorViews:
    def __init__(self, store: Store) -> None:
        self.store = store

    def count_by_outcome(self) -> list[OutcomeCount]:
        """Calls, attempts and retries per tool, effect class and status: the ended ones from
        their maintained counts, the open ones counted through their partial indexes. One
        statement (one round trip): a UNION ALL whose branches are planned one by one."""
        counts = call_counts.c
        ended = select(
            counts.tool_name,
            counts.effect,
            counts.status,
            func.sum(counts.calls),
            func.sum(counts.attempts),
            func.sum(counts.retries),
        ).group_by(counts.tool_name, counts.effect, counts.status)
        # A group whose calls were all pruned (`store/retention.py`) sums to zero: like the scan,
        # it is not reported.
        ended = ended.having(func.sum(counts.calls) != 0)
        calls = tool_calls.c
        retries = case((calls.attempts > 1, calls.attempts - 1), else_=0)
        # One branch per open status: `status = '...'` is what lets the planner use that
        # status's partial index (`IN (...)` would imply neither index's condition).
        still_open = [
            select(
                calls.tool_name,
                calls.effect,
                calls.status,
                func.count(),
                func.coalesce(func.sum(calls.attempts), 0),
                func.coalesce(func.sum(retries), 0),
            )
            .where(calls.status == status.value)
            .group_by(calls.tool_name, calls.effect, calls.status)
            for status in CallStatus
            if not status.terminal
        ]
        with self.store.engine.connect() as conn:
            return [
                OutcomeCount(str(t), str(e), str(s), int(n), int(a), int(r))
                for t, e, s, n, a, r in conn.execute(union_all(ended, *still_open))
            ]

    def count_by_outcome_scan(self) -> list[OutcomeCount]:
        """The same counts from one grouped scan of every call: what `count_by_outcome` must
        always equal (the tests compare them; too slow for a scrape of a long history)."""
        retries = case((tool_calls.c.attempts > 1, tool_calls.c.attempts - 1), else_=0)
        query = select(
            tool_calls.c.tool_name,
            tool_calls.c.effect,
            tool_calls.c.status,
            func.count(),
            func.coalesce(func.sum(tool_calls.c.attempts), 0),
            func.coalesce(func.sum(retries), 0),
        ).group_by(tool_calls.c.tool_name, tool_calls.c.effect, tool_calls.c.status)
        with self.store.engine.connect() as conn:
            return [
                OutcomeCount(str(t), str(e), str(s), int(n), int(a), int(r))
                for t, e, s, n, a, r in conn.execute(query)
            ]

    def count_in_flight(self) -> int:
        """Calls recorded and not ended that no one needs to decide: `pending`."""
        query = (
            select(func.count())
            .select_from(tool_calls)
            .where(tool_calls.c.status == CallStatus.PENDING.value)
        )
        with self.store.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def approval_backlog(self, now: float) -> ApprovalBacklog:
        """Calls waiting for a person: awaiting approval and before their deadline (one past
        it is rejected by the next sweep, whoever looks first)."""
        query = (
            select(
                func.count(),
                func.min(tool_calls.c.requested_at),
                func.min(tool_calls.c.approval_deadline),
            )
            .where(tool_calls.c.status == CallStatus.AWAITING_APPROVAL.value)
            .where(tool_calls.c.approval_deadline > now)
        )
        with self.store.engine.connect() as conn:
            count, oldest, nearest = conn.execute(query).one()
        return ApprovalBacklog(
            int(count),
            float(oldest) if oldest is not None else None,
            float(nearest) if nearest is not None else None,
        )

    def oldest_open_unknown_end(self) -> float | None:
        """When the longest-waiting surfaced, unreported `outcome_unknown` call ended (None if
        none is open): the open rows of the reconcile table, read through its index on `state`,
        each joined to its call by primary key, so the read follows the backlog, not history."""
        query = (
            select(func.min(tool_calls.c.finished_at))
            .select_from(
                unknown_outcomes.join(tool_calls, tool_calls.c.key == unknown_outcomes.c.call_key)
            )
            .where(unknown_outcomes.c.state == OPEN)
        )
        with self.store.engine.connect() as conn:
            ended = conn.execute(query).scalar_one()
        return float(ended) if ended is not None else None

    def _unreported(self) -> tuple[Any, Any]:
        joined = tool_calls.outerjoin(
            unknown_outcomes, unknown_outcomes.c.call_key == tool_calls.c.key
        )
        condition = and_(
            tool_calls.c.status == CallStatus.OUTCOME_UNKNOWN.value,
            (unknown_outcomes.c.state.is_(None)) | (unknown_outcomes.c.state != REPORTED),
        )
        return joined, condition

    def count_unreported_unknowns(self) -> int:
        """`outcome_unknown` calls (their maintained count) less those reported (read from
        the reconcile table's index on `state`): a call never leaves `outcome_unknown`, and
        only such calls have a row there (`store/unknowns.py`)."""
        unknown = (
            select(func.coalesce(func.sum(call_counts.c.calls), 0))
            .where(call_counts.c.status == CallStatus.OUTCOME_UNKNOWN.value)
            .scalar_subquery()
        )
        reported = (
            select(func.count())
            .select_from(unknown_outcomes)
            .where(unknown_outcomes.c.state == REPORTED)
            .scalar_subquery()
        )
        with self.store.engine.connect() as conn:
            return max(0, int(conn.execute(select(unknown - reported)).scalar_one()))

    def count_unreported_unknowns_scan(self) -> int:
        """The same from the calls themselves (a scan; for the tests)."""
        joined, condition = self._unreported()
        query = select(func.count()).select_from(joined).where(condition)
        with self.store.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def unreported_unknowns(self, *, limit: int = 200) -> list[UnreportedUnknown]:
        """Oldest end first: the call that has waited longest for a report leads."""
        joined, condition = self._unreported()
        query = (
            select(tool_calls, unknown_outcomes.c.call_key.label("u_key"))
            .select_from(joined)
            .where(condition)
            .order_by(tool_calls.c.finished_at, tool_calls.c.key)
            .limit(limit)
        )
        keys: list[tuple[ToolCallRecord, bool]] = []
        with self.store.engine.connect() as conn:
            for row in conn.execute(query).mappings():
                keys.append((call_record(dict(row)), row["u_key"] is not None))
            states: dict[str, UnknownOutcome] = {}
            surfaced = [r.key for r, has in keys if has]
            if surfaced:
                rows = conn.execute(
                    select(unknown_outcomes).where(unknown_outcomes.c.call_key.in_(surfaced))
                ).mappings()
                states = {r["call_key"]: _row(r) for r in rows}
        return [UnreportedUnknown(r, states.get(r.key)) for r, _ in keys]

    def search(self, search: CallSearch) -> list[ToolCallRecord]:
        """Calls matching every given filter, newest request first."""
        query = select(tool_calls).order_by(
            tool_calls.c.requested_at.desc(), tool_calls.c.key.desc()
        )
        if search.session_id:
            query = query.where(tool_calls.c.session_id == search.session_id)
        if search.tool_name:
            query = query.where(tool_calls.c.tool_name == search.tool_name)
        if search.status is not None:
            query = query.where(tool_calls.c.status == search.status.value)
        if search.since is not None:
            query = query.where(tool_calls.c.requested_at >= search.since)
        if search.until is not None:
            query = query.where(tool_calls.c.requested_at < search.until)
        query = query.limit(max(1, min(search.limit, MAX_SEARCH)))
        with self.store.engine.connect() as conn:
            return [call_record(r) for r in conn.execute(query).mappings()]

    def tool_names(self) -> list[str]:
        query = select(tool_calls.c.tool_name).distinct().order_by(tool_calls.c.tool_name)
        with self.store.engine.connect() as conn:
            return [str(r[0]) for r in conn.execute(query)]
