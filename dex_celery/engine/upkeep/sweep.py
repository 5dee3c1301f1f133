"""The sweeper: finds what stopped moving and moves it (docs/ledger.md, "Sweeps").

Every scan reads a deadline index (`ZRANGEBYSCORE ... LIMIT`) or an indexed SQL status, so its
cost follows the number of due items, never the size of history. Every move is a compare-and-set
script or a conditional update, so two sweepers at once cause each transition once. A failure on
one item is logged and left for the next sweep; it never stops the others.

A sharded ledger (docs/redis.md, "Redis Cluster") is swept shard by shard: each shard's indexes,
and, after a new life of some shards, the finished events of those shards announced again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Protocol, cast

from dex_celery.backend_errors import translating_backend_errors
from dex_celery.engine.counters import count_sql_write_errors, record_sweep
from dex_celery.engine.decided_outcomes import finished_step
from dex_celery.engine.request import expire_approval
from dex_celery.engine.steps import claimed_write, claimed_write_outcome
from dex_celery.errors import LedgerMismatch
from dex_celery.ledger.freeze import reassert
from dex_celery.ledger.keys import ShardKeys
from dex_celery.ledger.ledger import LoseMode, Step, StepKind, shard_epoch
from dex_celery.model.event_types import EventType
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ToolCallRecord
from dex_celery.store.freezes import WriteFreezes
from dex_celery.store.values import Outcome

if TYPE_CHECKING:
    from dex_celery.engine.epoch import LedgerEpoch
    from dex_celery.engine.request import Opener
    from dex_celery.engine.steps import Steps
    from dex_celery.ledger.ledger import Ledger
    from dex_celery.settings import Settings
    from dex_celery.store.repository import Store

log = logging.getLogger("dex_celery.engine.upkeep.sweep")


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


#: How far before the last surviving event the replay after a rollback looks, for outcomes
#: written to SQL just before their event was appended.
REPLAY_MARGIN = 5.0
#: Most finished events one replay announces again.
REPLAY_LIMIT = 10_000


@translating_backend_errors
class Sweeper:
    """One per process (`runtime`); handed what it moves things with, nothing else."""

    def __init__(
        self,
        ledger: Ledger,
        store: Store,
        steps: Steps,
        opener: Opener,
        settings: Settings,
        epoch: LedgerEpoch,
    ) -> None:
        self.ledger = ledger
        self.store = store
        self.steps = steps
        self.opener = opener
        self.settings = settings
        self.epoch = epoch
        self._epoch: str | None = None
        self._freezes = WriteFreezes(lambda: store.engine)

    def sweep_once(self, *, check_orphans: bool = True) -> SweepReport:
        """One sweep: every due item of every index, then approvals and orphans."""
        started = time.monotonic()
        # Before acting on ledger state: is this the database's ledger (else LedgerMismatch),
        # and has Redis gone back in time since the last look (then a new epoch, S10.2)?
        epoch = self.epoch.current(refresh=True)
        if self._epoch is not None and epoch != self._epoch:
            shards = self.ledger.keys.shards
            for shard in self.ledger.keys.all_shards:
                now_epoch = shard_epoch(epoch, shard.index, shards)
                if now_epoch != shard_epoch(self._epoch, shard.index, shards):
                    self._replay_finished_events(now_epoch, shard)
        self._epoch = epoch
        counts = dict.fromkeys(("lost", "expired", "timed_out", "recorded"), 0)
        errors = self._keep_freezes()
        errors += self._move_due(counts)
        now = self.ledger.now()
        errors += self._record_unrecorded_due(now, counts)
        approvals, e1 = self._expire_approvals(now)
        reopened, ended, e2 = self._orphans(now) if check_orphans else (0, 0, 0)
        report = SweepReport(
            **counts,
            approvals_expired=approvals,
            reopened=reopened,
            ended_after_data_loss=ended,
            errors=errors + e1 + e2,
        )
        if report.moved or report.errors:
            log.info("sweep: %s", report.as_dict())
        record_sweep(self.ledger, started, report.errors)  # for metrics and status
        return report

    def _moves(self) -> list[tuple[str, str, Callable[[str], Step]]]:
        """(deadline index, count name, the ledger transition of a due item) for each index of
        each shard."""
        return [move for keys in self.ledger.keys.all_shards for move in self._shard_moves(keys)]

    def _shard_moves(self, keys: ShardKeys) -> list[tuple[str, str, Callable[[str], Step]]]:
        ledger = self.ledger
        return [
            (
                keys.lease_index,
                "lost",
                lambda k: ledger.lose(
                    k, None, mode=LoseMode.LAPSED, detail="its heartbeat lease lapsed"
                ),
            ),
            (
                keys.queue_index,
                "expired",
                lambda k: ledger.expire(
                    k,
                    None,
                    unpublished=False,
                    detail="no worker claimed it before its schedule-to-start deadline",
                ),
            ),
            (
                keys.close_index,
                "timed_out",
                lambda k: ledger.time_out(
                    k, None, detail="fenced by the sweeper at its start-to-close deadline"
                ),
            ),
        ]

    def _keep_freezes(self) -> int:
        """The ledger's copy of the write freezes equals SQL's (S13.2, `ledger/freeze.py`):
        a freeze Redis lost is back before this sweep opens or retries anything. 1 on failure
        (counted as the sweep's error, tried again next sweep)."""
        try:
            reassert(self.ledger, self._freezes)
        except Exception as e:
            log.warning("could not re-assert the write freezes in the ledger: %s", e)
            return 1
        return 0

    def _move_due(self, counts: dict[str, int]) -> int:
        """Move every due item of the three deadline indexes; returns the number of errors."""
        errors = 0
        for index, name, move in self._moves():
            for key in self.ledger.due(index, now=None, limit=self.settings.sweep_batch):
                try:
                    step = move(key)
                    if step.kind is not StepKind.NOOP:
                        counts[name] += 1
                        self.steps.apply(key, step)
                except Exception:
                    errors += 1
                    log.exception("sweep (%s) failed for %s; left for the next sweep", name, key)
        return errors

    def _record_unrecorded_due(self, now: float, counts: dict[str, int]) -> int:
        """Write the outcomes left unrecorded past their grace; returns the number of errors."""
        errors = 0
        due = [
            key
            for shard in self.ledger.keys.all_shards
            for key in self.ledger.due(
                shard.unrecorded_index,
                now=now - self.settings.unrecorded_grace,
                limit=self.settings.sweep_batch,
            )
        ]
        for key in due:
            try:
                if self._record_unrecorded(key):
                    counts["recorded"] += 1
            except Exception:
                errors += 1
                log.exception("could not record the outcome of %s; left for the next sweep", key)
                count_sql_write_errors(self.ledger, "sweeper")
        return errors

    def _replay_finished_events(self, epoch: str, keys: ShardKeys) -> int:
        """The events stream of a shard went back in time with Redis: announce again, once, the
        shard's calls that ended after its last surviving entry, so every ended call has its
        finished event (S7.3). `epoch` is the shard's new one.
        """
        ledger = self.ledger
        if not ledger.client.set(keys.replayed(epoch), "1", nx=True, ex=self.settings.finished_ttl):
            return 0  # another process replays this rollback
        last = ledger.client.xrevrange(keys.events, count=1)
        if last:
            since = int(str(last[0][0]).split("-")[0]) / 1000 - REPLAY_MARGIN
        else:  # the stream is gone with the data: the recent past, as the ledger keeps it
            since = ledger.now() - self.settings.finished_ttl
        start = f"{max(0, int(since * 1000))}-0"
        entries = cast(
            list[tuple[str, dict[str, str]]], ledger.client.xrange(keys.events, min=start)
        )
        seen = {f.get("key") for _id, f in entries if f.get("type") == EventType.TOOL_CALL_FINISHED}
        replayed = 0
        for record in self.store.finished_since(since, limit=REPLAY_LIMIT):
            if ledger.keys.shard_of(record.key) != keys.index:
                continue
            if record.key not in seen:
                ledger.events.publish_finished(
                    record.key, status=record.status.value, error=record.error or ""
                )
                replayed += 1
        if replayed:
            log.warning("announced %d finished events again after the ledger's rollback", replayed)
        return replayed

    def _record_unrecorded(self, key: str) -> bool:
        """A worker decided an outcome but died before its SQL write: write it now."""
        entry = self.ledger.read(key)
        if entry is None or entry.status not in {s.value for s in CallStatus if s.terminal}:
            return False
        self.steps.record(key, finished_step(entry), result=entry.result)
        return True

    def _expire_approvals(self, now: float) -> tuple[int, int]:
        count = errors = 0
        for record in self.store.approvals_due(now, limit=self.settings.sweep_batch):
            try:
                if self.expire_approval(record, now):
                    count += 1
            except Exception:
                errors += 1
                log.exception("could not expire the approval of %s", record.key)
        return count, errors

    def expire_approval(self, record: ToolCallRecord, now: float) -> bool:
        """End a call whose approval deadline passed (the rule: `approvals.expire_approval`)."""
        return expire_approval(self.store, self.ledger, record, now)

    def _orphans(self, now: float) -> tuple[int, int, int]:
        """SQL calls in flight with no entry in the ledger's current life (docs/ledger.md).

        Either never opened (a crash between the SQL insert and the ledger open), or opened in
        a life of the ledger that Redis lost (it went back in time, or lost its data). A write
        whose claim the database holds may have run: `outcome_unknown`, never run again. A
        write the database never saw claimed cannot have run (the write fence): opened afresh.
        A read or idempotent write is opened again; if an earlier life may have run it, it can
        never end "did not run".
        """
        candidates = self._next_orphan_page(now)
        if not candidates:
            return 0, 0, 0
        live = self.ledger.live([c.key for c in candidates])
        epoch = self.epoch.recorded()
        reopened = ended = errors = 0
        for record in candidates:
            if live[record.key]:
                continue
            try:
                if claimed_write(record):
                    if self._end_after_data_loss(record):
                        ended += 1
                    continue
                may_have_run = record.effect.retryable and record.ledger_epoch != epoch
                self.opener.start(record, may_have_run=may_have_run)
                reopened += 1
            except Exception:
                errors += 1
                log.exception("could not resolve orphaned call %s", record.key)
        return reopened, ended, errors

    def _next_orphan_page(self, now: float) -> list[ToolCallRecord]:
        """One page of calls in flight, continuing where the previous sweep stopped.

        Paging keeps one sweep's cost bounded by `sweep_batch` while every call in flight is
        still looked at within (in-flight calls / sweep_batch) sweeps, however long the backlog.
        """
        client, cursor_key = self.ledger.client, self.ledger.keys.orphan_cursor
        raw = client.get(cursor_key)
        after: tuple[float, str] | None = None
        if raw:
            at, _, key = str(raw).partition("|")
            after = (float(at), key)
        limit = self.settings.sweep_batch
        page = self.store.in_flight_before(
            now - self.settings.orphan_grace, limit=limit, after=after
        )
        if len(page) < limit:
            client.delete(cursor_key)  # the end: start from the oldest next time
        else:
            client.set(cursor_key, f"{page[-1].requested_at!r}|{page[-1].key}")
        return page

    def _end_after_data_loss(self, record: ToolCallRecord) -> bool:
        """The ledger that knew whether this write reached a worker is gone: be conservative."""
        outcome = claimed_write_outcome(record, record.attempts)
        error = outcome.error or ""
        done = self.store.record_outcome(
            record.key, Outcome(CallStatus.OUTCOME_UNKNOWN, outcome.error)
        )
        if done:
            log.warning("call %s ended outcome_unknown: %s", record.key, error)
            self.ledger.events.publish_finished(
                record.key, status=CallStatus.OUTCOME_UNKNOWN.value, error=error
            )
        return done


class HasSweeper(Protocol):
    """Anything that holds this process's sweeper (a `Dex`)."""

    @property
    def sweeper(self) -> Sweeper: ...


def run_forever(
    sweeper: Sweeper | HasSweeper,
    *,
    stop: threading.Event | None = None,
    interval: float | None = None,
) -> None:
    """Sweep every `interval` seconds until `stop` is set (`dex-celery sweep --loop`, beat,
    tests). Given a `Dex`, its sweeper runs (built once per process)."""
    if not isinstance(sweeper, Sweeper):
        sweeper = sweeper.sweeper
    stop = stop or threading.Event()
    interval = interval or sweeper.settings.sweep_interval
    refused: str | None = None
    while not stop.is_set():
        try:
            sweeper.sweep_once()
        except LedgerMismatch as e:
            # Not a passing failure: nothing changes until an operator acts, so it is said once
            # (with how to recover), not every interval; the loop keeps looking.
            if str(e) != refused:
                log.error("the sweeper cannot sweep: %s; checking again every %.1fs", e, interval)
            refused = str(e)
        except Exception:
            log.exception("sweep failed; trying again in %.1fs", interval)
        else:
            if refused is not None:
                log.warning("the sweeper sweeps again: the ledger is the database's")
            refused = None
        stop.wait(interval)
