"""Bounded history (S12.4): remove what can never matter again, archived first.

A prune walks the calls requested before the cutoff in small batches. For each batch it
(1) selects the calls that may go (`store/retention.select_calls`), (2) appends them to the
archive as one gzip member and fsyncs it, (3) deletes them in one short transaction that
re-checks what could have changed. Then it walks the sessions the same way. A process killed at
any point leaves every call whole in SQL or whole in the archive (or, between (2) and (3)'s
commit, in both: harmless, a later prune archives it again). Batches are small
(`prune_batch`), so a worker's write never waits long behind a prune's transaction.

Beat runs `Retention.run_once` every `retention_interval` when `retention` is set
(`processes/beat.py`); `dex-celery -A APP history prune` runs `prune` by hand.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dex_celery.audit.prune import audit_archive_path, prune_audit
from dex_celery.ledger.ledger import Ledger
from dex_celery.settings import Settings
from dex_celery.store.archive import Archive
from dex_celery.store.prune_sessions import delete_sessions, select_sessions, sessions_left_empty
from dex_celery.store.repository import Store
from dex_celery.store.retention import KeptReason, StillRunning, delete_calls, select_calls

log = logging.getLogger("dex_celery.engine.upkeep.retention")


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What a prune removed (or, dry, would remove) and why the rest of the old calls stay."""

    calls: int = 0
    sessions: int = 0
    messages: int = 0
    kept: dict[str, int] = field(default_factory=dict)
    archive: str | None = None
    dry_run: bool = False
    seconds: float = 0.0
    #: Audit entries cut, and the file they went to (`audit/prune.py`).
    audit_entries: int = 0
    audit_archive: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "sessions": self.sessions,
            "messages": self.messages,
            "kept": dict(self.kept),
            "archive": self.archive,
            "dry_run": self.dry_run,
            "seconds": round(self.seconds, 3),
            "audit_entries": self.audit_entries,
            "audit_archive": self.audit_archive,
        }

    def summary(self) -> str:
        """One line: `history prune: removed 1000 calls, ... (kept: open=2, ...)`."""
        verb = "would remove" if self.dry_run else "removed"
        kept = ", ".join(f"{k}={v}" for k, v in sorted(self.kept.items()) if v) or "none"
        where = f"; archive {self.archive}" if self.archive and self.calls + self.sessions else ""
        if self.audit_archive:
            where += f"; {self.audit_entries} audit entries to {self.audit_archive}"
        return (
            f"history prune: {verb} {self.calls} calls, {self.sessions} sessions, "
            f"{self.messages} messages in {self.seconds:.1f}s (kept: {kept}){where}"
        )


def prune(
    store: Store,
    *,
    cutoff: float,
    now: float,
    archive: Path | None,
    batch: int,
    still_running: StillRunning,
    dry_run: bool = False,
    progress: Callable[[PruneReport], None] | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> PruneReport:
    """Remove the history that ended before `cutoff` and may never matter again (archived to
    `archive` first; nothing is written or deleted when `dry_run`). `stopping` is asked before
    each batch: beat's shutdown ends a long prune between two batches."""
    started = time.monotonic()
    engine = store.engine
    writer = Archive(archive) if archive is not None and not dry_run else None
    if writer is not None:
        writer.check()  # an existing file that is no archive: refused before any delete
    calls = sessions = messages = audited = 0
    audit_file: Path | None = None
    kept: Counter[KeptReason] = Counter()
    going: Counter[str] = Counter()

    def report() -> PruneReport:
        return PruneReport(
            calls=calls,
            sessions=sessions,
            messages=messages,
            kept={k.value: v for k, v in kept.items()},
            archive=str(archive) if writer is not None else None,
            dry_run=dry_run,
            seconds=time.monotonic() - started,
            audit_entries=audited,
            audit_archive=str(audit_file) if audited else None,
        )

    try:
        after: str | None = None
        while not stopping():
            selected = select_calls(
                engine,
                cutoff=cutoff,
                now=now,
                after=after,
                limit=batch,
                still_running=still_running,
            )
            if selected.last_key is None:
                break
            after = selected.last_key
            kept.update(selected.kept)
            if writer is None:
                calls += len(selected.records)
                messages += sum(len(r["messages"]) for r in selected.records)
                going.update(r["call"]["session_id"] for r in selected.records)
            else:
                writer.append(selected.records)  # durable before anything is deleted
                removed = delete_calls(engine, selected.records, store.audit, cutoff)
                calls += removed.calls
                messages += removed.messages
            if progress is not None:
                progress(report())
        if writer is None:
            sessions, more = sessions_left_empty(engine, going, cutoff=cutoff)
            messages += more
        else:
            after = None
            while not stopping():
                records, after = select_sessions(engine, cutoff=cutoff, after=after, limit=batch)
                if after is None:
                    break
                writer.append(records)
                removed = delete_sessions(engine, records, cutoff=cutoff)
                sessions += removed.sessions
                messages += removed.messages
                if records and progress is not None:
                    progress(report())
        if writer is not None and archive is not None and not stopping():
            audit_file = audit_archive_path(archive, now)
            audited = prune_audit(store, cutoff=cutoff, archive=audit_file)
    finally:
        if writer is not None:
            writer.close()
    return report()


def archive_path(directory: str, now: float) -> Path:
    """A new archive file in `directory`, named by the run's UTC time."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    return Path(directory) / f"dex-history-{stamp}.jsonl.gz"


class Retention:
    """Beat's retention job: one prune of what ended more than `retention` ago."""

    def __init__(self, store: Store, ledger: Ledger, settings: Settings) -> None:
        self.store = store
        self.ledger = ledger
        self.settings = settings

    def run_once(self, stopping: Callable[[], bool] = lambda: False) -> PruneReport | None:
        """Prune once; None when no retention is set (history is kept forever)."""
        keep = self.settings.retention_seconds
        if keep is None:
            return None
        now = self.ledger.now()
        result = prune(
            self.store,
            cutoff=now - keep,
            now=now,
            archive=archive_path(self.settings.retention_archive, now),
            batch=self.settings.prune_batch,
            still_running=self.ledger.still_running,
            stopping=stopping,
        )
        log.info("%s", result.summary())
        return result
