"""A session as one story: its messages, calls, attempts, approvals and reports in time order
(S13.6).

Today a person investigating one conversation pieces it together from `calls list --session`,
`calls show` per call, the approvals page and the reconcile log. `session_timeline` reads them
all once and lays them out as `Entry`s on one time line; `dex-celery sessions show` (text and
`--json`) and the web app's session page both render its answer, so they never disagree.

Each kind of thing that happens to a session is one `EntrySource`: a function from the facts
read once (`SessionFacts`) to entries. A new kind of decision (a budget held, a write frozen, an
approval edited) joins by reading its rows in `gather` and adding its source to `SOURCES`;
nothing else changes. Entries show what every other output shows: arguments under the one
display rule (`tools/redact.py`, docs/secrets.md), texts as the worker scrubbed them, long values
cut unless asked for whole, times in UTC (`model/times.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis
from sqlalchemy import Engine, select

from dex_celery.audit.entries import AuditKind, digest
from dex_celery.engine import RuntimeSource
from dex_celery.ledger.ledger import LedgerCall
from dex_celery.model.budgets import charges_of_json
from dex_celery.model.ids import validate_id
from dex_celery.model.links import session_path
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import Message, MessageRole, SessionRecord, ToolCallRecord
from dex_celery.model.report_text import already_reported
from dex_celery.model.times import format_utc
from dex_celery.ops.present import (
    CUT_MARK,
    attempt_history,
    attempts_started,
    call_summary,
    cut_text,
    cut_value,
)
from dex_celery.store.budgets import WENT_THROUGH
from dex_celery.store.freezes import FreezeHold, WriteFreezes
from dex_celery.store.schema import audit_log
from dex_celery.store.unknowns import REPORTED, UnknownOutcome, UnknownOutcomes
from dex_celery.tools.redact import record_arguments, shown_arguments


class EntryKind(StrEnum):
    """What one entry of a timeline records. Entries at the same instant are shown in this
    order (a call is requested before it is asked about, an attempt ends before its call)."""

    SESSION_OPENED = "session_opened"
    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"
    CALL_REQUESTED = "call_requested"
    BUDGET_CHARGED = "budget_charged"
    BUDGET_OVER = "budget_over"
    APPROVAL_ASKED = "approval_asked"
    APPROVAL_DECIDED = "approval_decided"
    #: An approver's edit of the arguments, one decision with the approval (S13.3.3).
    APPROVAL_EDITED = "approval_edited"
    #: An approved call sent back to wait: its tool changed before it ran (S13.3.2).
    APPROVAL_ASKED_AGAIN = "approval_asked_again"
    #: A write freeze held the call at its claim (S13.2), and a thaw let it run.
    HELD_BY_FREEZE = "held_by_freeze"
    RELEASED_BY_THAW = "released_by_thaw"
    ATTEMPT_CLAIMED = "attempt_claimed"
    ATTEMPT_ENDED = "attempt_ended"
    CALL_ENDED = "call_ended"
    TOOL_RESULT = "tool_result"
    BUDGET_SETTLED = "budget_settled"
    OUTCOME_SURFACED = "outcome_surfaced"
    OUTCOME_CHECK_FAILED = "outcome_check_failed"
    REPORT = "report"
    REPORT_FOUND = "report_found"

    @property
    def label(self) -> str:
        """How a person reads the kind: `call requested`."""
        return self.value.replace("_", " ")


_RANK = {kind: rank for rank, kind in enumerate(EntryKind)}


@dataclass(frozen=True, slots=True)
class Entry:
    """One thing that happened to the session, when, to which call, by whom.

    `summary` is one line; `text` the body a person may want whole (a message, arguments, a
    result, an error), cut unless the timeline was read `full`; `state` a call or attempt
    state (`succeeded`, `outcome_unknown`, ...) where one applies.
    """

    at: float
    kind: EntryKind
    summary: str
    call_key: str | None = None
    actor: str | None = None
    text: str | None = None
    state: str | None = None

    @property
    def call_name(self) -> str | None:
        """The call as `turn/call`: its session is the timeline's own."""
        return self.call_key.split("/", 1)[1] if self.call_key else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "time": format_utc(self.at),
            "kind": self.kind.value,
            "summary": self.summary,
            "call_key": self.call_key,
            "actor": self.actor,
            "text": self.text,
            "state": self.state,
        }


@dataclass(frozen=True, slots=True)
class SessionFacts:
    """Everything the sources read, read once: the session's record, its calls (oldest first),
    its messages (in the order written), the ledger's entries of its calls in flight, what the
    reconcile job surfaced, and which tools have an outcome check."""

    session: SessionRecord
    calls: tuple[ToolCallRecord, ...]
    messages: tuple[Message, ...]
    ledger: Mapping[str, LedgerCall | None]
    unknowns: tuple[UnknownOutcome, ...]
    checked_tools: frozenset[str]
    full: bool
    #: The write freeze's holds of the session's calls (S13.2).
    holds: tuple[FreezeHold, ...] = ()
    #: Approved calls sent back to wait (S13.3.2), from the audit log: (when, call, deadline).
    rewaits: tuple[tuple[float, str, float | None], ...] = ()

    def cut(self, text: str | None) -> str | None:
        """A long text cut (`present.cut_text`) unless the timeline is read whole."""
        if text is None or self.full:
            return text
        return cut_text(text)[0]


#: One kind of thing that happens to a session: its entries, from the facts.
EntrySource = Callable[[SessionFacts], Iterable[Entry]]


def _session_entries(facts: SessionFacts) -> Iterator[Entry]:
    yield Entry(
        facts.session.created_at,
        EntryKind.SESSION_OPENED,
        "first named by a call or a message",
        text=f"default effect class: {facts.session.default_effect.value}"
        if facts.session.default_effect
        else None,
    )


def _message_entries(facts: SessionFacts) -> Iterator[Entry]:
    """User, assistant and system messages, and each call's tool result as the model read it.
    A user message that names an `outcome_unknown` call of the session is that call's report
    (S8.1; the same test as `calls show`, `model/report_text.py`)."""
    unknown = [c.key for c in facts.calls if c.status is CallStatus.OUTCOME_UNKNOWN]
    ended = {c.key: c.finished_at or 0.0 for c in facts.calls}
    session = facts.session.id
    for m in facts.messages:
        if m.role is MessageRole.TOOL:
            key = f"{session}/{m.turn_id}/{m.tool_call_id}"
            # Written with the outcome, in its transaction, by the writer's reading of the
            # ledger's clock: never shown before the end the ledger decided.
            yield Entry(
                max(m.created_at, ended.get(key, 0.0)),
                EntryKind.TOOL_RESULT,
                f"the model was told the result of {m.tool_name or 'the call'}",
                call_key=key,
                text=facts.cut(m.tool_output),
            )
            continue
        reported = None
        if m.role is MessageRole.USER and not m.mirrored:
            reported = next((k for k in unknown if already_reported(k, m.text or "")), None)
        if reported is not None:
            yield Entry(
                m.created_at,
                EntryKind.REPORT,
                "the session was told the real outcome",
                call_key=reported,
                actor="reconcile",
                text=facts.cut(m.text),
            )
            continue
        kind = EntryKind(m.role.value)
        source = "copied from the agent framework's history" if m.mirrored else "written to dex"
        yield Entry(m.created_at, kind, f"{kind.label} message ({source})", text=facts.cut(m.text))


def _call_entries(facts: SessionFacts) -> Iterator[Entry]:
    """Each call's request (with its arguments as requested, under the display rule), its
    approval asked and decided (or expired), and its end. A call a write freeze held waits from
    its hold (`_freeze_entries`), not from its request."""
    held = {h.call_key for h in facts.holds}
    for record in facts.calls:
        # As requested: a call an approver edited keeps the requested arguments in its edit
        # (under the display rule, as `record_arguments` shows them); the edit is an entry.
        edit = record.approval_edit
        requested = (
            shown_arguments(edit.before, record.policy.secret_arguments)
            if edit is not None
            else record_arguments(record)
        )
        arguments, _ = (requested, False) if facts.full else cut_value(requested)
        yield Entry(
            record.requested_at,
            EntryKind.CALL_REQUESTED,
            f"{record.tool_name} requested ({record.effect.value})",
            call_key=record.key,
            text=json.dumps(arguments, ensure_ascii=False, sort_keys=True),
        )
        yield from _approval_entries(record, asked=record.key not in held)
        if record.finished and record.finished_at:
            yield Entry(
                record.finished_at,
                EntryKind.CALL_ENDED,
                _ended(record),
                call_key=record.key,
                text=facts.cut(record.error),  # the result: as the model read it (TOOL_RESULT)
                state=record.status.value,
            )


def _approval_entries(record: ToolCallRecord, *, asked: bool = True) -> Iterator[Entry]:
    if record.approval_deadline is None and record.approval is None:
        return
    held = f"; held back: {record.repeat_reason}" if record.repeat_reason else ""
    if asked:
        yield Entry(
            record.requested_at,
            EntryKind.APPROVAL_ASKED,
            f"waits for a person's decision until {format_utc(record.approval_deadline)}{held}",
            call_key=record.key,
            state=CallStatus.AWAITING_APPROVAL.value,
        )
    approval = record.approval
    if approval is not None:
        yield Entry(
            approval.decided_at,
            EntryKind.APPROVAL_DECIDED,
            f"{approval.decision} by {approval.decided_by}",
            call_key=record.key,
            actor=approval.decided_by,
            text=approval.note,
            state=approval.decision,
        )


def _edit_entries(facts: SessionFacts) -> Iterator[Entry]:
    """An approver's edit of the arguments (S13.3.3): who, what changed (before and after as
    the call keeps them, under the one display rule: secrets `***`), and the digest of the
    arguments the call runs with, the one the audit log's `approval_edited` entry holds
    (docs/audit.md)."""
    for record in facts.calls:
        edit = record.approval_edit
        if edit is None:
            continue
        secrets = record.policy.secret_arguments
        was, now = shown_arguments(edit.before, secrets), shown_arguments(edit.after, secrets)
        changed = [k for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)]
        what = ", ".join(changed) if changed else "none shown"
        before = json.dumps(was, ensure_ascii=False, sort_keys=True)
        after = json.dumps(now, ensure_ascii=False, sort_keys=True)
        yield Entry(
            edit.at,
            EntryKind.APPROVAL_EDITED,
            f"arguments edited by {edit.by} when approving (changed: {what}); "
            f"arguments digest {_short(digest(record.arguments))}",
            call_key=record.key,
            actor=edit.by,
            text=facts.cut(f"{before} -> {after}"),
            state="edited",
        )


def _rewait_entries(facts: SessionFacts) -> Iterator[Entry]:
    """An approved call sent back to wait because its tool changed before it ran (S13.3.2).
    The call's record keeps only its latest approval (a rewait clears the decision), so the
    moment comes from the audit log's `approval_asked` entry that cleared it; the reason is
    the record's (who approved, what changed)."""
    reasons = {record.key: record.rewait_reason for record in facts.calls}
    for at, key, deadline in facts.rewaits:
        why = reasons.get(key) or "its tool changed after the approval, before it ran"
        yield Entry(
            at,
            EntryKind.APPROVAL_ASKED_AGAIN,
            f"waits for a person again until {format_utc(deadline)}: {why}",
            call_key=key,
            state=CallStatus.AWAITING_APPROVAL.value,
        )


def _rewaits(store_engine: Engine, session_id: str) -> tuple[tuple[float, str, float | None], ...]:
    """The audit log's entries that sent an approved call of the session back to wait."""
    query = (
        select(audit_log.c.at, audit_log.c.call_key, audit_log.c.body)
        .where(audit_log.c.session_id == session_id)
        .where(audit_log.c.kind == AuditKind.APPROVAL_ASKED.value)
        .order_by(audit_log.c.at)
    )
    with store_engine.connect() as conn:
        rows = conn.execute(query).all()
    found = []
    for at, key, body in rows:
        fields = json.loads(body)
        if fields.get("cleared") and key:
            found.append((float(at), str(key), fields.get("deadline")))
    return tuple(found)


def _short(hex_digest: str | None) -> str:
    """A digest as people compare it with the audit log's (its first 16 hex digits)."""
    return (hex_digest or "-")[:16]


def _budget_entries(facts: SessionFacts) -> Iterator[Entry]:
    """Write budgets (S13.1): what each call was charged when requested (the limit it was
    judged by), a call over a budget and why, and what became of the charge when the call
    ended (spent, held while unknown, released) or was reconciled."""
    verdicts = {u.call_key: u for u in facts.unknowns if u.verdict}
    for record in facts.calls:
        charges = charges_of_json(record.budgets)
        if not charges:
            continue
        approval = record.approval
        admitted_over = approval is not None and approval.decision == "approved"
        if record.budget_reason:
            yield Entry(
                record.requested_at,
                EntryKind.BUDGET_OVER,
                f"over budget: {record.budget_reason}",
                call_key=record.key,
                state=CallStatus.AWAITING_APPROVAL.value
                if admitted_over or not record.finished
                else record.status.value,
            )
        if not record.budget_reason or (approval is not None and admitted_over):
            # Reserved at its open; one a person approved over its budget, at the approval.
            at, by = record.requested_at, ""
            if record.budget_reason and approval is not None:
                at, by = (
                    approval.decided_at,
                    f" (admitted over the budget by {approval.decided_by})",
                )
            for c in charges:
                yield Entry(
                    at,
                    EntryKind.BUDGET_CHARGED,
                    f"charged {c.amount} to budget {c.name} ({c.scope_id}, limit {c.limit}): "
                    f"reserved{by}",
                    call_key=record.key,
                    state="reserved",
                )
        elif record.budget_reason:
            continue  # never admitted: nothing was reserved, nothing to settle
        if not record.finished or not record.finished_at:
            continue
        state = {
            CallStatus.SUCCEEDED: "spent",
            CallStatus.OUTCOME_UNKNOWN: "held until reconciled",
        }.get(record.status, "released")
        names = ", ".join(c.name for c in charges)
        yield Entry(
            record.finished_at,
            EntryKind.BUDGET_SETTLED,
            f"budget {names}: {state}",
            call_key=record.key,
            state=state.split()[0],
        )
        settled = verdicts.get(record.key)
        if settled is not None and settled.reported_at is not None:
            state = "spent" if settled.verdict == WENT_THROUGH else "released"
            yield Entry(
                settled.reported_at,
                EntryKind.BUDGET_SETTLED,
                f"budget {names}: {state} (reconciled: {settled.verdict})",
                call_key=record.key,
                actor="reconcile",
                state=state,
            )


def _ended(record: ToolCallRecord) -> str:
    tried = f"{record.attempts} attempt{'' if record.attempts == 1 else 's'}"
    return f"{record.status.value} after {tried}"


def _attempt_entries(facts: SessionFacts) -> Iterator[Entry]:
    """Each attempt claimed (by which worker and process) and ended (how), from the SQL attempt
    log, or the ledger for a call still in flight (`present.attempt_history`)."""
    for record in facts.calls:
        for a in attempt_history(record, facts.ledger.get(record.key)):
            number, state = a.get("attempt"), str(a.get("state") or "")
            worker = str(a.get("node") or a.get("owner") or "a worker")
            pid = f" (pid {a['pid']})" if a.get("pid") else ""
            if a.get("claimed_at"):
                yield Entry(
                    float(a["claimed_at"]),
                    EntryKind.ATTEMPT_CLAIMED,
                    f"attempt {number} claimed by {worker}{pid}",
                    call_key=record.key,
                    actor=worker,
                    state="running",
                )
            if a.get("ended_at"):
                yield Entry(
                    _same_instant(float(a["ended_at"]), record.finished_at),
                    EntryKind.ATTEMPT_ENDED,
                    f"attempt {number} {state} on {worker}",
                    call_key=record.key,
                    actor=worker,
                    text=facts.cut(a.get("error")),
                    state=state,
                )


#: The attempt log's times are written by the ledger's JSON encoder with 14 significant digits,
#: the call's end with 17 (`ledger/scripts/_common.lua`): at today's Unix times the same instant
#: may read up to 0.05 ms later in the log.
_LOG_PRECISION = 0.0001


def _same_instant(ended_at: float, finished_at: float | None) -> float:
    """An attempt's end as the call's end when they are one instant written at two precisions
    (the last attempt ends the call): so the attempt ends first, as it did."""
    if finished_at is not None and 0 < ended_at - finished_at <= _LOG_PRECISION:
        return finished_at
    return ended_at


def _reconcile_entries(facts: SessionFacts) -> Iterator[Entry]:
    """What the reconcile job did with the session's unknown outcomes (S8.4): surfaced, a check
    that failed last, a report found already in the history. The report it sent is a message
    (`_message_entries`)."""
    for u in facts.unknowns:
        how = ""
        if u.state != REPORTED:  # what happens next, as this process's registered checks say
            checked = u.tool_name in facts.checked_tools
            how = (
                " (its outcome check will be asked)"
                if checked
                else " (no outcome check: a person must find out)"
            )
        yield Entry(
            u.surfaced_at,
            EntryKind.OUTCOME_SURFACED,
            f"surfaced for reconciliation{how}",
            call_key=u.call_key,
            actor="reconcile",
        )
        if u.last_error and u.last_checked_at and u.state != REPORTED:
            yield Entry(
                u.last_checked_at,
                EntryKind.OUTCOME_CHECK_FAILED,
                f"outcome check failed ({u.checks} check{'' if u.checks == 1 else 's'} so far)",
                call_key=u.call_key,
                actor="reconcile",
                text=facts.cut(u.last_error),
            )
        if u.state == REPORTED and u.report is None and u.reported_at:
            yield Entry(
                u.reported_at,
                EntryKind.REPORT_FOUND,
                "closed: the session's history already named the call",
                call_key=u.call_key,
                actor="reconcile",
            )


def _freeze_entries(facts: SessionFacts) -> Iterator[Entry]:
    """The write freeze (S13.2): a call held at its claim, with the freeze's reason, and the
    thaw that let it run. A call a `--reject` freeze ended shows as its decision.

    The hold is timed by the holding worker's reading of the ledger's clock, the request by the
    requester's (S10.1): each process's reading may be a millisecond apart, so a hold is never
    shown before its call's request, nor a release before its hold."""
    requested = {c.key: c.requested_at for c in facts.calls}
    for hold in facts.holds:
        freeze = hold.freeze
        held_at = max(hold.held_at, requested.get(hold.call_key, hold.held_at))
        yield Entry(
            held_at,
            EntryKind.HELD_BY_FREEZE,
            f"held by a write freeze of {freeze.scope_text} (frozen by {freeze.frozen_by} "
            f"since {format_utc(freeze.since)})",
            call_key=hold.call_key,
            actor=freeze.frozen_by,
            text=facts.cut(freeze.reason),
            state=CallStatus.AWAITING_APPROVAL.value,
        )
        if hold.released_at is not None:
            by = freeze.thawed_by or "a thaw"
            yield Entry(
                max(hold.released_at, held_at),
                EntryKind.RELEASED_BY_THAW,
                f"released to run: writes of {freeze.scope_text} thawed by {by}",
                call_key=hold.call_key,
                actor=freeze.thawed_by,
            )


#: Every kind of thing that happens to a session. A new one joins here (and reads its rows in
#: `gather`): the CLI and the web page show it with no change of their own.
SOURCES: tuple[EntrySource, ...] = (
    _session_entries,
    _message_entries,
    _call_entries,
    _edit_entries,
    _rewait_entries,
    _budget_entries,
    _attempt_entries,
    _reconcile_entries,
    _freeze_entries,
)


@dataclass(frozen=True, slots=True)
class Timeline:
    """One session as one story: its calls (as `calls list` shows them) and every entry, oldest
    first. `open_calls`: calls not ended yet (the page refreshes while there are any)."""

    session_id: str
    created_at: float
    path: str
    calls: tuple[dict[str, Any], ...]
    entries: tuple[Entry, ...]
    open_calls: tuple[str, ...]
    ledger_error: str | None
    full: bool

    @property
    def live(self) -> bool:
        return bool(self.open_calls)

    @property
    def cut(self) -> bool:
        """Whether a long value was cut (`full` shows them whole)."""
        return not self.full and any(e.text and CUT_MARK in e.text for e in self.entries)

    def as_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "created_at": self.created_at,
            "created": format_utc(self.created_at),
            "path": self.path,
            "open_calls": list(self.open_calls),
            "calls": list(self.calls),
            "entries": [e.as_dict() for e in self.entries],
            "ledger_error": self.ledger_error,
            "cut": self.cut,
        }


def gather(
    source: RuntimeSource,
    session_id: str,
    *,
    checked_tools: Collection[str] = (),
    full: bool = False,
) -> tuple[SessionFacts, str | None]:
    """Read what the sources need, once: SQL (the session, its calls and messages, what the
    reconcile job surfaced) and, for calls in flight only, the ledger in one round trip. Redis
    away: the SQL attempt logs alone, and why (the second value)."""
    store = source.runtime.store
    session = store.get_session(validate_id("session id", session_id))  # UnknownSession
    calls, messages = store.snapshot(session.id)
    live = [c.key for c in calls if not c.finished]
    ledger: Mapping[str, LedgerCall | None] = {}
    ledger_error = None
    if live:
        try:
            ledger = source.runtime.ledger.read_many(live)
        except redis.RedisError as e:
            ledger_error = f"{type(e).__name__}: {e}"
    facts = SessionFacts(
        session=session,
        calls=tuple(calls),
        messages=tuple(messages),
        ledger=ledger,
        unknowns=tuple(UnknownOutcomes(store).of_session(session.id)),
        checked_tools=frozenset(checked_tools),
        full=full,
        holds=tuple(WriteFreezes(lambda: store.engine).holds_of([c.key for c in calls])),
        rewaits=_rewaits(store.engine, session.id),
    )
    return facts, ledger_error


def assemble(facts: SessionFacts, sources: Sequence[EntrySource] = SOURCES) -> list[Entry]:
    """Every source's entries in time order; at one instant, in the order of `EntryKind`, then
    by call (a stable sort: a source's own order stands last)."""
    entries = [e for source in sources for e in source(facts)]
    return sorted(entries, key=lambda e: (e.at, _RANK[e.kind], e.call_key or ""))


def session_timeline(
    source: RuntimeSource,
    session_id: str,
    *,
    checked_tools: Collection[str] = (),
    full: bool = False,
) -> Timeline:
    """The session `session_id` as one story; `UnknownSession` if there is none, `InvalidId`
    for an id no call could have. `checked_tools`: the tools with an outcome check here
    (`dex.outcome_checks.tool_names`), to say what becomes of an unknown outcome still open."""
    facts, ledger_error = gather(source, session_id, checked_tools=checked_tools, full=full)
    summaries = tuple(
        call_summary(c, attempts_started(c, facts.ledger.get(c.key))) for c in facts.calls
    )
    return Timeline(
        session_id=facts.session.id,
        created_at=facts.session.created_at,
        path=session_path(facts.session.id),
        calls=summaries,
        entries=tuple(assemble(facts)),
        open_calls=tuple(c.key for c in facts.calls if not c.finished),
        ledger_error=ledger_error,
        full=full,
    )
