"""Pruning the audit log with the history it speaks of (S13.4.5, `engine/upkeep/retention.py`).

Each chain is cut after its last entry older than the prune's cutoff. The entries cut go first
to an archive of their own beside the history's archive (the export format, `audit/export.py`:
it starts at the chain's previous cut, ends at the new one, and is sealed), fsynced; then one
transaction deletes them and leaves, per chain, a signed checkpoint of its hash at the cut, from
which the chain left in SQL continues. So `audit verify` passes after a prune, and the archive
verifies on its own.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from sqlalchemy import delete, func, select

from dex_celery.audit.check import Anchor
from dex_celery.audit.entries import Chained, checkpoint_digest
from dex_celery.audit.export import FORMAT, SealedWriter
from dex_celery.audit.verify import anchors, entries
from dex_celery.store.dialect import upsert
from dex_celery.store.repository import Store
from dex_celery.store.schema import audit_checkpoints, audit_log


def audit_archive_path(history_archive: Path, now: float) -> Path:
    """A new file beside the history's archive, named by the run's UTC time."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    base = history_archive.with_name(f"{history_archive.name}.audit-{stamp}")
    path, n = base.with_name(base.name + ".jsonl"), 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}.jsonl")
    return path


def prune_audit(store: Store, *, cutoff: float, archive: Path) -> int:
    """Cut every chain after its last entry older than `cutoff`; the number of entries cut.
    No archive file is made when nothing is cut."""
    signer = store.audit.signer
    with store.engine.connect() as conn:
        last_old = dict(
            conn.execute(
                select(audit_log.c.writer, func.max(audit_log.c.seq))
                .where(audit_log.c.at < cutoff)
                .group_by(audit_log.c.writer)
            ).all()
        )
        if not last_old:
            return 0
        _heads, old_cuts = anchors(conn)
        cut: dict[str, Chained] = {}
        cut_at: dict[str, float] = {}
        count = 0
        with archive.open("x") as out:
            sealed = SealedWriter(out, signer)
            sealed.line({"type": "header", "format": FORMAT, "scope": {"prune": cutoff}})
            for writer in sorted(last_old):
                if writer in old_cuts:
                    sealed.line({"type": "start", **old_cuts[writer].as_dict()})
            for entry in entries(conn, None):
                if entry.seq > last_old.get(entry.writer, 0):
                    continue
                sealed.line({"type": "entry", **entry.as_dict()})
                cut[entry.writer] = entry
                cut_at[entry.writer] = max(cut_at.get(entry.writer, entry.at), entry.at)
                count += 1
            checkpoints = []
            for writer, entry in sorted(cut.items()):
                digest = checkpoint_digest(writer, entry.seq, entry.hash, cut_at[writer])
                anchor = Anchor(
                    writer,
                    entry.seq,
                    entry.hash,
                    cut_at[writer],
                    signer.sign(digest) if signer is not None else None,
                    signer.key_id if signer is not None else None,
                )
                checkpoints.append(anchor)
                sealed.line({"type": "end", **anchor.as_dict()})
            sealed.seal()
            out.flush()
            os.fsync(out.fileno())
    with store.engine.begin() as conn:
        for anchor in checkpoints:
            conn.execute(
                delete(audit_log)
                .where(audit_log.c.writer == anchor.writer)
                .where(audit_log.c.seq <= anchor.seq)
            )
            values = {
                "writer": anchor.writer,
                "seq": anchor.seq,
                "hash": anchor.hash,
                "cut_at": anchor.at,
                "signature": anchor.signature,
                "key_id": anchor.key_id,
            }
            conn.execute(upsert(conn, audit_checkpoints, values, ["writer"]))
    return count
