"""What a prune may remove from SQL, and its removal in small transactions (S12.4); the
sessions' part is `store/prune_sessions.py`.

Each table, and what a prune does to it (docs/operations.md, "Retention"):

- `dex_tool_calls`: a call goes when it ended before the cutoff and nothing may still read it:
  not an unreconciled `outcome_unknown`, not the earlier call of one waiting for approval (the
  approver reads it), not the holder of a repeat-guard slot the guard would still judge unsafe
  to repeat (`model/repeat_rule.judge_repeat`, the guard's own rule). Its attempts are its
  `attempt_log` column: they go with it.
- `dex_messages`: a removed call's TOOL message goes with it; a session's other messages go
  only with the whole session.
- `dex_sessions`, `dex_session_owners`: a session goes when no call of it is left and it has no
  message from after the cutoff (and began before it).
- `dex_unknown_outcomes`: a removed (reconciled) call's row goes with it.
- `dex_budget_charges`: a removed call's charges go with it (a retention shorter than a budget's
  window makes a recount of that budget forget successes older than the retention).
- `dex_repeat_guards`: a slot whose holder is removed goes with it (the guard would let the
  next identical call pass either way: a slot naming no call is free).
- `dex_call_counts`: the removed calls are subtracted in the delete's transaction, so the counts
  behind `/metrics` equal a grouped scan of the calls in SQL at every commit (`store/counts.py`).
- `dex_ledger_binding`, `dex_mcp_servers`, `dex_mcp_tool_pins`: configuration, not history;
  never touched.
- `dex_write_freezes`, `dex_freeze_holds`: the record of who froze writes, when and why, and of
  the calls a freeze held (S13.2); a few rows per incident, kept as the audit trail, never
  touched.

Rows are read in key order (the primary key: a scan that continues where the last batch ended,
so one prune reads each call once), archived by the caller, and deleted with conditions that
re-check, in the delete itself, what could have changed since they were read.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Engine, and_, delete, exists, or_, select
from sqlalchemy.sql.elements import ColumnElement

from dex_celery.audit import call_entries
from dex_celery.audit.chain import NOTHING, AuditLog
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.repeat_rule import judge_repeat
from dex_celery.store.counts import count_ended
from dex_celery.store.dialect import IN_CHUNK, one_of
from dex_celery.store.hot import hot_statements
from dex_celery.store.rows import call_record
from dex_celery.store.schema import (
    budget_charges,
    messages,
    repeat_guards,
    tool_calls,
    unknown_outcomes,
)
from dex_celery.store.unknowns import REPORTED

TERMINAL = tuple(s.value for s in CallStatus if s.terminal)


class KeptReason(StrEnum):
    """Why a call requested before the cutoff stays."""

    #: Pending or awaiting approval.
    OPEN = "open"
    #: Ended after the cutoff.
    RECENT = "recent"
    #: `outcome_unknown`, its real outcome not reported to the session yet.
    UNRECONCILED = "unreconciled"
    #: A call waiting for approval repeats it; the approver reads it.
    APPROVAL_WAITING = "approval_waiting"
    #: It holds a repeat-guard slot the guard would still judge (its window, a fenced attempt
    #: still running).
    REPEAT_GUARD = "repeat_guard"


#: Is a fenced attempt of this call still running (the ledger's lease)? Asked only of failed
#: guard holders without a late result.
StillRunning = Callable[[str], bool]


@dataclass(frozen=True, slots=True)
class Selection:
    """One scanned batch: the archive records of calls to remove, and why the others stay."""

    records: list[dict[str, Any]]
    kept: Counter[KeptReason] = field(default_factory=Counter)
    #: The last key scanned: the next batch starts after it; None when the scan is done.
    last_key: str | None = None


@dataclass(frozen=True, slots=True)
class Removed:
    """What one delete transaction removed."""

    calls: int = 0
    messages: int = 0
    sessions: int = 0


def chunks(items: Sequence[Any]) -> Iterable[Sequence[Any]]:
    """`items` in slices short enough for one `IN` list."""
    for start in range(0, len(items), IN_CHUNK):
        yield items[start : start + IN_CHUNK]


def plain(row: Any) -> dict[str, Any]:
    """A row as the archive keeps it: every column, as stored."""
    return dict(row)


# --- calls -----------------------------------------------------------------------------------


def select_calls(
    engine: Engine,
    *,
    cutoff: float,
    now: float,
    after: str | None,
    limit: int,
    still_running: StillRunning,
) -> Selection:
    """The next `limit` calls requested before `cutoff` (in key order after `after`): those a
    prune may remove, as archive records, and the reasons the others stay."""
    query = select(tool_calls).where(tool_calls.c.requested_at < cutoff)
    if after is not None:
        query = query.where(tool_calls.c.key > after)
    query = query.order_by(tool_calls.c.key).limit(limit)
    with engine.connect() as conn:
        rows = [plain(r) for r in conn.execute(query).mappings()]
        if not rows:
            return Selection([], Counter(), None)
        kept: Counter[KeptReason] = Counter()
        ended: list[dict[str, Any]] = []
        for row in rows:
            if row["status"] not in TERMINAL:
                kept[KeptReason.OPEN] += 1
            elif row["finished_at"] is None or row["finished_at"] >= cutoff:
                kept[KeptReason.RECENT] += 1
            else:
                ended.append(row)
        keys = [r["key"] for r in ended]
        reported = _reported(conn, [r["key"] for r in ended if r["status"] == "outcome_unknown"])
        waited_on = _waited_on(conn, keys)
        holders = _guard_holders(conn, ended)
        going = []
        for row in ended:
            key = row["key"]
            if row["status"] == CallStatus.OUTCOME_UNKNOWN.value and key not in reported:
                kept[KeptReason.UNRECONCILED] += 1
            elif key in waited_on:
                kept[KeptReason.APPROVAL_WAITING] += 1
            elif key in holders and _guard_still_judges(row, key in reported, now, still_running):
                kept[KeptReason.REPEAT_GUARD] += 1
            else:
                going.append(row)
        records = _call_records(conn, going)
    return Selection(records, kept, rows[-1]["key"])


def _reported(conn: Connection, keys: list[str]) -> set[str]:
    found: set[str] = set()
    for chunk in chunks(keys):
        query = (
            select(unknown_outcomes.c.call_key)
            .where(one_of(conn, unknown_outcomes.c.call_key, chunk))
            .where(unknown_outcomes.c.state == REPORTED)
        )
        found.update(str(k) for k in conn.execute(query).scalars())
    return found


def _waited_on(conn: Connection, keys: list[str]) -> set[str]:
    """Keys some call awaiting approval repeats (the partial index on `repeat_of`)."""
    found: set[str] = set()
    for chunk in chunks(keys):
        query = (
            select(tool_calls.c.repeat_of)
            .where(one_of(conn, tool_calls.c.repeat_of, chunk))
            .where(tool_calls.c.status == CallStatus.AWAITING_APPROVAL.value)
        )
        found.update(str(k) for k in conn.execute(query).scalars())
    return found


def _guard_holders(conn: Connection, rows: list[dict[str, Any]]) -> set[str]:
    """Keys among `rows` that hold a repeat-guard slot (looked up by the slots' session)."""
    guarded = [r for r in rows if r["repeat_digest"] is not None]
    found: set[str] = set()
    for chunk in chunks(guarded):
        query = (
            select(repeat_guards.c.holder)
            .where(
                one_of(conn, repeat_guards.c.session_id, sorted({r["session_id"] for r in chunk}))
            )
            .where(one_of(conn, repeat_guards.c.holder, [r["key"] for r in chunk]))
        )
        found.update(str(k) for k in conn.execute(query).scalars())
    return found


def _guard_still_judges(
    row: dict[str, Any], reconciled: bool, now: float, still_running: StillRunning
) -> bool:
    """Would the guard hold back a new identical call because of this holder? The new call's
    window is its tool's policy; the holder's recorded policy stands for it."""
    record = call_record(row)
    running = (
        record.status is CallStatus.FAILED
        and record.late_result is None
        and still_running(record.key)
    )
    hazard = judge_repeat(
        record,
        reconciled=reconciled,
        still_running=running,
        now=now,
        window=record.policy.repeat_window,
    )
    return hazard is not None


def _call_records(conn: Connection, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One archive record per call: its row as stored (secrets sealed as they are in SQL), its
    attempts, its TOOL message and its reconcile row."""
    keys = [r["key"] for r in rows]
    tool_messages: dict[str, list[dict[str, Any]]] = {}
    unknown: dict[str, dict[str, Any]] = {}
    for chunk in chunks(keys):
        for m in conn.execute(
            select(messages).where(one_of(conn, messages.c.call_key, chunk))
        ).mappings():
            tool_messages.setdefault(m["call_key"], []).append(plain(m))
        query = select(unknown_outcomes).where(one_of(conn, unknown_outcomes.c.call_key, chunk))
        for u in conn.execute(query).mappings():
            unknown[u["call_key"]] = plain(u)
    return [
        {
            "kind": "call",
            "key": row["key"],
            "call": row,
            "attempts": _attempts(row["attempt_log"]),
            "messages": tool_messages.get(row["key"], []),
            "unknown_outcome": unknown.get(row["key"]),
        }
        for row in rows
    ]


def _attempts(log: str | None) -> list[Any]:
    """The attempt log's entries as the ledger wrote them (`ledger/attempt_log.py`)."""
    try:
        entries = json.loads(log) if log else []
    except ValueError:  # kept as stored in `call.attempt_log`
        return []
    return entries if isinstance(entries, list) else []  # cjson writes an empty log as {}


#: The calls waiting for approval, as seen from a call a prune is about to delete.
_waiting = tool_calls.alias("waiting")


def delete_calls(
    engine: Engine,
    records: list[dict[str, Any]],
    audit: AuditLog | None = None,
    cutoff: float = 0.0,
) -> Removed:
    """Delete the archived calls, their TOOL messages, reconcile rows and guard slots, and take
    them off the counts, in one transaction. A call whose row changed since it was archived (a
    late result arrived; a call waiting for approval now repeats it) stays. `audit`: the log the
    batch's `history_pruned` entry is appended to, naming the calls removed (S13.4.5)."""
    if not records:
        return Removed()
    keys = [r["key"] for r in records]
    with_late = [r["key"] for r in records if r["call"]["late_result"] is not None]
    still_waited: ColumnElement[bool] = exists().where(
        and_(
            _waiting.c.repeat_of == tool_calls.c.key,
            _waiting.c.status == CallStatus.AWAITING_APPROVAL.value,
        )
    )
    with engine.begin() as conn:
        unchanged = or_(
            tool_calls.c.late_result.is_(None), one_of(conn, tool_calls.c.key, with_late)
        )
        gone: list[tuple[str, str, str, str, str, int]] = []
        for chunk in chunks(keys):
            result = conn.execute(
                delete(tool_calls)
                .where(one_of(conn, tool_calls.c.key, chunk))
                .where(tool_calls.c.status.in_(TERMINAL))
                .where(unchanged)
                .where(~still_waited)
                .returning(
                    tool_calls.c.key,
                    tool_calls.c.session_id,
                    tool_calls.c.tool_name,
                    tool_calls.c.effect,
                    tool_calls.c.status,
                    tool_calls.c.attempts,
                )
            )
            gone.extend(
                (str(k), str(s), str(t), str(e), str(st), int(a or 0))
                for k, s, t, e, st, a in result
            )
        removed = {g[0] for g in gone}
        message_ids = [m["id"] for r in records if r["key"] in removed for m in r["messages"]]
        dropped = 0
        for chunk in chunks(message_ids):
            dropped += conn.execute(
                delete(messages).where(one_of(conn, messages.c.id, chunk))
            ).rowcount
        gone_keys = sorted(removed)
        for chunk in chunks(gone_keys):
            conn.execute(
                delete(unknown_outcomes).where(one_of(conn, unknown_outcomes.c.call_key, chunk))
            )
            conn.execute(
                delete(budget_charges).where(one_of(conn, budget_charges.c.call_key, chunk))
            )
        slots = sorted({(g[1], g[0]) for g in gone})
        for chunk in chunks(slots):
            conn.execute(
                delete(repeat_guards)
                .where(one_of(conn, repeat_guards.c.session_id, sorted({s for s, _ in chunk})))
                .where(one_of(conn, repeat_guards.c.holder, [k for _, k in chunk]))
            )
        _uncount(conn, engine, [(t, e, st, a) for _, _, t, e, st, a in gone])
        appended = NOTHING
        if audit is not None and gone_keys:
            appended = audit.append(conn, call_entries.pruned(gone_keys, cutoff))
    appended.committed()
    return Removed(calls=len(gone), messages=dropped)


def _uncount(conn: Connection, engine: Engine, gone: list[tuple[str, str, str, int]]) -> None:
    """Subtract removed calls from `dex_call_counts` (negative amounts, last in the
    transaction, as writers add)."""
    count_ended(conn, hot_statements(engine), gone, sign=-1)
