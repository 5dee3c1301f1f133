"""The sweeper: finds what stopped moving and moves it (DESIGN.md, flow step 6).

Every scan reads a deadline index (`ZRANGEBYSCORE ... LIMIT`) or an indexed SQL status, so its
cost follows the number of due items, never the size of history. Every move is a compare-and-set
script or a conditional update, so two sweepers at once cause each transition once. A failure on
one item is logged and left for the next sweep; it never stops the others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from dex_celery.health import record_sweep
from dex_celery.ledger.ledger import Step, StepKind
from dex_celery.outcomes import CallStatus, EndReason, error_text
from dex_celery.records import ApprovalDecision, ToolCallRecord
from dex_celery.store.repository import Outcome

if TYPE_CHECKING:
    from dex_celery.app import Dex

log = logging.getLogger("dex_celery.sweep")

APPROVAL_EXPIRED_BY = "system: approval deadline"


@dataclass(frozen=True, slots=True)
class SweepReport:
    """How many items each part of one sweep moved."""

    lost: int = 0
    expired: int = 0
    timed_out: int = 0
    recorded: int = 0
    approvals_expired: int = 0
    reopened: int = 0
    ended_after_data_loss: int = 0
    errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def moved(self) -> int:
        return sum(v for k, v in self.as_dict().items() if k != "errors")


class Sweeper:
    def __init__(self, dex: Dex) -> None:
        self.dex = dex

    def sweep_once(self, *, check_orphans: bool = True) -> SweepReport:
        ledger, keys, batch = self.dex.ledger, self.dex.keys, self.dex.settings.sweep_batch
        counts = {"lost": 0, "expired": 0, "timed_out": 0, "recorded": 0}
        errors = 0

        def each(
            index: str, name: str, move: Callable[[str], Step], *, before: float | None = None
        ) -> None:
            nonlocal errors
            for key in ledger.due(index, now=before, limit=batch):
                try:
                    step = move(key)
                    if step.kind is not StepKind.NOOP:
                        counts[name] += 1
                        self.dex.dispatcher.apply(key, step)
                except Exception:
                    errors += 1
                    log.exception("sweep (%s) failed for %s; left for the next sweep", name, key)

        each(
            keys.lease_index,
            "lost",
            lambda k: ledger.lose(k, None, worker_lost=False, detail="its heartbeat lease lapsed"),
        )
        each(
            keys.queue_index,
            "expired",
            lambda k: ledger.expire(
                k,
                None,
                unpublished=False,
                detail="no worker claimed it before its schedule-to-start deadline",
            ),
        )
        each(
            keys.close_index,
            "timed_out",
            lambda k: ledger.time_out(
                k, None, detail="fenced by the sweeper at its start-to-close deadline"
            ),
        )
        now = ledger.clock()
        for key in ledger.due(
            keys.unrecorded_index, now=now - self.dex.settings.unrecorded_grace, limit=batch
        ):
            try:
                if self._record_unrecorded(key):
                    counts["recorded"] += 1
            except Exception:
                errors += 1
                log.exception("could not record the outcome of %s; left for the next sweep", key)
        approvals, e1 = self._expire_approvals(now)
        reopened = ended = 0
        e2 = 0
        if check_orphans:
            reopened, ended, e2 = self._orphans(now)
        report = SweepReport(
            **counts,
            approvals_expired=approvals,
            reopened=reopened,
            ended_after_data_loss=ended,
            errors=errors + e1 + e2,
        )
        if report.moved or report.errors:
            log.info("sweep: %s", report.as_dict())
        record_sweep(self.dex, now, report.errors)
        return report

    def _record_unrecorded(self, key: str) -> bool:
        """A worker decided an outcome but died before its SQL write: write it now."""
        entry = self.dex.ledger.read(key)
        if entry is None or entry.status not in {s.value for s in CallStatus if s.terminal}:
            return False
        log_text = ";".join(
            f"{e.attempt}|{e.state}|{e.owner}|{e.claimed_at or ''}|{e.ended_at}" for e in entry.log
        )
        step = Step(
            StepKind.FINISHED,
            attempt=entry.attempt,
            status=entry.status,
            reason=entry.reason,
            log=log_text,
            detail=entry.error,
        )
        self.dex.dispatcher.record(key, step, result=entry.result)
        return True

    def _expire_approvals(self, now: float) -> tuple[int, int]:
        count = errors = 0
        for record in self.dex.store.approvals_due(now, limit=self.dex.settings.sweep_batch):
            try:
                if self.expire_approval(record, now):
                    count += 1
            except Exception:
                errors += 1
                log.exception("could not expire the approval of %s", record.key)
        return count, errors

    def expire_approval(self, record: ToolCallRecord, now: float) -> bool:
        error = (
            "the approval deadline passed before anyone approved the call "
            f"(deadline {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(record.approval_deadline or now))} UTC)"
        )
        decision = ApprovalDecision("expired", APPROVAL_EXPIRED_BY, now, None)
        done = self.dex.store.record_outcome(
            record.key,
            Outcome(CallStatus.REJECTED, error),
            from_statuses=(CallStatus.AWAITING_APPROVAL,),
            decision=decision,
        )
        if done:
            self.dex.ledger.announce(
                {
                    "type": "tool_call_decided",
                    "key": record.key,
                    "decision": "expired",
                    "by": APPROVAL_EXPIRED_BY,
                }
            )
            self.dex.ledger.announce_finished(
                record.key, status=CallStatus.REJECTED.value, error=error
            )
        return done

    def _orphans(self, now: float) -> tuple[int, int, int]:
        """SQL calls in flight with no ledger entry: never opened, or Redis lost its data."""
        candidates = self._next_orphan_page(now)
        if not candidates:
            return 0, 0, 0
        exists = self.dex.ledger.exists([c.key for c in candidates])
        epoch = self.dex.epoch(refresh=True)
        reopened = ended = errors = 0
        for record in candidates:
            if exists[record.key]:
                continue
            try:
                if record.ledger_epoch == epoch or record.effect.retryable:
                    # Never opened (a crash between the SQL insert and the ledger open), or a
                    # read / idempotent write whose repetition is harmless: (re)start it. Opened
                    # in a ledger that is gone, it may have run: never "did not run" (S4.2).
                    self.dex.dispatcher.start(record, may_have_run=record.ledger_epoch != epoch)
                    reopened += 1
                elif self._end_after_data_loss(record):
                    ended += 1
            except Exception:
                errors += 1
                log.exception("could not resolve orphaned call %s", record.key)
        return reopened, ended, errors

    def _next_orphan_page(self, now: float) -> list[ToolCallRecord]:
        """One page of calls in flight, continuing where the previous sweep stopped.

        Paging keeps one sweep's cost bounded by `sweep_batch` while every call in flight is
        still looked at within (in-flight calls / sweep_batch) sweeps, however long the backlog.
        """
        client, cursor_key = self.dex.ledger.client, self.dex.keys.orphan_cursor
        raw = client.get(cursor_key)
        after: tuple[float, str] | None = None
        if raw:
            at, _, key = str(raw).partition("|")
            after = (float(at), key)
        limit = self.dex.settings.sweep_batch
        page = self.dex.store.in_flight_before(
            now - self.dex.settings.orphan_grace, limit=limit, after=after
        )
        if len(page) < limit:
            client.delete(cursor_key)  # the end: start from the oldest next time
        else:
            client.set(cursor_key, f"{page[-1].requested_at!r}|{page[-1].key}")
        return page

    def _end_after_data_loss(self, record: ToolCallRecord) -> bool:
        """The ledger that knew whether this write reached a worker is gone: be conservative."""
        detail = "the ledger lost its data (Redis restarted empty) while the call was in flight"
        error = error_text(
            CallStatus.OUTCOME_UNKNOWN, EndReason.LOST, detail, max(record.attempts, 1)
        )
        done = self.dex.store.record_outcome(record.key, Outcome(CallStatus.OUTCOME_UNKNOWN, error))
        if done:
            log.warning("call %s ended outcome_unknown: %s", record.key, detail)
            self.dex.ledger.announce_finished(
                record.key, status=CallStatus.OUTCOME_UNKNOWN.value, error=error
            )
        return done


def run_forever(
    dex: Dex, *, stop: threading.Event | None = None, interval: float | None = None
) -> None:
    """Sweep every `interval` seconds until `stop` is set (`dex-celery sweep --loop`, tests)."""
    stop = stop or threading.Event()
    interval = interval or dex.settings.sweep_interval
    sweeper = Sweeper(dex)
    while not stop.is_set():
        try:
            sweeper.sweep_once()
        except Exception:
            log.exception("sweep failed; trying again in %.1fs", interval)
        stop.wait(interval)
