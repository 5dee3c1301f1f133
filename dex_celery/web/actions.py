"""What the web app's buttons do besides approving and rejecting.

`reconcile_session` is the reconcile beat job (S8.4) narrowed to one session, for an operator
who does not want to wait for the next run: the same registered outcome checks, the same
"reported once" guard (`UnknownOutcomes.report` flips `open -> reported` and appends the user
message in one transaction), the same `tool_call_outcome_reported` event (so webhooks fire).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dex_celery.engine.events import EventType
from dex_celery.engine.reconcile import CannotTellYet, run_check
from dex_celery.model.ids import validate_id
from dex_celery.model.message_text import check_text
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import MessageRole
from dex_celery.model.report_text import already_reported, format_report
from dex_celery.store.unknowns import UnknownOutcomes

if TYPE_CHECKING:
    from dex_celery.app import Dex

log = logging.getLogger("dex_celery.web")


@dataclass(frozen=True, slots=True)
class SessionReconcile:
    """What one run for one session did, key by key."""

    session_id: str
    reported: tuple[str, ...] = ()
    already_reported: tuple[str, ...] = ()
    cannot_tell_yet: tuple[str, ...] = ()
    no_check: tuple[str, ...] = ()
    errors: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def summary(self) -> str:
        parts = [
            f"{len(self.reported)} reported",
            f"{len(self.already_reported)} already reported",
            f"{len(self.cannot_tell_yet)} cannot tell yet",
            f"{len(self.no_check)} without an outcome check (left for a person)",
            f"{len(self.errors)} failed",
        ]
        return f"session {self.session_id}: " + ", ".join(parts)


def reconcile_session(dex: Dex, session_id: str) -> SessionReconcile:
    """Ask the outcome check of each unreported `outcome_unknown` call of one session."""
    validate_id("session id", session_id)
    repo = UnknownOutcomes(dex.store)
    events = dex.events
    calls, history = dex.store.snapshot(session_id)
    sent = "\n".join(m.text or "" for m in history if m.role is MessageRole.USER)
    done: dict[str, list[str]] = {"reported": [], "already": [], "later": [], "no_check": []}
    errors: list[tuple[str, str]] = []
    for record in calls:
        if record.status is not CallStatus.OUTCOME_UNKNOWN:
            continue
        key, now = record.key, dex.store.clock()
        row = repo.get(key)
        if row is not None and row.state != "open":
            continue
        repo.surface(record, now=now)  # no-op if the beat job surfaced it already
        if already_reported(key, sent):
            repo.mark_reported(key, now=now)
            done["already"].append(key)
            continue
        check = dex.outcome_checks.get(record.tool_name)
        if check is None:
            done["no_check"].append(key)
            continue
        try:
            answer = run_check(check, key, record.arguments, timeout=dex.settings.check_timeout)
        except Exception as e:
            repo.note_check(key, now=dex.store.clock(), error=f"{type(e).__name__}: {e}")
            errors.append((key, f"{type(e).__name__}: {e}"))
            log.warning("outcome check for %s failed: %s", key, e)
            continue
        repo.note_check(key, now=dex.store.clock(), error=None)
        if isinstance(answer, CannotTellYet):
            done["later"].append(key)
            continue
        text = format_report(answer, key)
        check_text(text, limit=dex.settings.max_text_bytes)
        if repo.report(record, text, now=dex.store.clock()):
            done["reported"].append(key)
            sent += "\n" + text
            events.publish(EventType.TOOL_CALL_OUTCOME_REPORTED, key, tool=record.tool_name)
        else:
            done["already"].append(key)
    return SessionReconcile(
        session_id,
        tuple(done["reported"]),
        tuple(done["already"]),
        tuple(done["later"]),
        tuple(done["no_check"]),
        tuple(errors),
    )
