"""Appending to the audit log: the one function every feature calls (docs/audit.md).

    with store.engine.begin() as conn:
        ...  # the feature's own writes
        appended = store.audit.append(conn, Entry(AuditKind.FREEZE, {...}))
    appended.committed()

Each thread of each process is a writer with a chain of its own (S13.4.2: measured against one
chain in a total order, which would make every writing transaction of every process wait on one
row, docs/benchmarks.md). An append numbers the entries after the writer's last one, chains their
hashes, signs the last one and upserts the writer's head, all in the caller's transaction: no
commit, connection or round trip of its own (the recorder's batch carries its outcomes' entries).

The chain moves on only when the caller says the transaction committed (`committed()`). A
transaction that failed, or whose commit is unconfirmed, is never built on: the thread's next
append opens a new chain (a new writer), so a chain in SQL is always whole, whichever way the
commit went. A forked child opens its own chain too.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.engine.interfaces import DBAPICursor

from dex_celery.audit.entries import GENESIS, Entry, canonical, entry_hash
from dex_celery.audit.keys import Signer
from dex_celery.store.audit_sql import audit_statements
from dex_celery.store.hot import on_cursor


@dataclass(frozen=True, slots=True)
class _Head:
    writer: str
    seq: int
    hash: str
    pid: int
    committed: bool


class Appended:
    """What `append` returns: call `committed()` once the transaction has committed."""

    __slots__ = ("_head", "_log")

    def __init__(self, log: AuditLog | None, head: _Head | None) -> None:
        self._log = log
        self._head = head

    def committed(self) -> None:
        if self._log is not None and self._head is not None:
            self._log._committed(self._head)


#: What `append` returns when there was nothing to append.
NOTHING = Appended(None, None)


def new_writer() -> str:
    return secrets.token_hex(10)


class AuditLog:
    """The audit log of one store: per-thread chains, signed with the deployment's key."""

    def __init__(
        self,
        engine: Callable[[], Engine],
        signer: Signer | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = engine
        self.signer = signer
        self.clock = clock
        self._local = threading.local()

    def append(self, conn: Connection | DBAPICursor, *entries: Entry) -> Appended:
        """Append `entries`, in this order, in `conn`'s transaction (see the module docstring)."""
        if not entries:
            return NOTHING
        head: _Head | None = getattr(self._local, "head", None)
        pid = os.getpid()
        if head is None or not head.committed or head.pid != pid:
            head = _Head(new_writer(), 0, GENESIS, pid, True)
        writer, seq, prev = head.writer, head.seq, head.hash
        now = float(self.clock())
        rows: list[dict[str, Any]] = []
        for entry in entries:
            seq += 1
            at = now if entry.at is None else float(entry.at)
            body = canonical(entry.body)
            digest = entry_hash(
                prev, writer, seq, at, entry.kind.value, entry.call_key, entry.session_id, body
            )
            rows.append(
                {
                    "writer": writer,
                    "seq": seq,
                    "at": at,
                    "kind": entry.kind.value,
                    "call_key": entry.call_key,
                    "session_id": entry.session_id,
                    "body": body,
                    "prev": prev,
                    "hash": digest,
                    "signature": None,
                    "key_id": None,
                }
            )
            prev = digest
        last = rows[-1]
        if self.signer is not None:
            last["signature"] = self.signer.sign(last["hash"])
            last["key_id"] = self.signer.key_id
        statements = audit_statements(self._engine())
        with on_cursor(conn) as cursor:  # one INSERT of every entry
            statements.insert_entries.execute(cursor, rows)
        statements.upsert_head.execute(
            conn,
            {
                "writer": writer,
                "seq": seq,
                "hash": prev,
                "at": last["at"],
                "signature": last["signature"],
                "key_id": last["key_id"],
            },
        )
        tentative = _Head(writer, seq, prev, pid, False)
        self._local.head = tentative
        return Appended(self, tentative)

    def _committed(self, head: _Head) -> None:
        if getattr(self._local, "head", None) is head:
            self._local.head = _Head(head.writer, head.seq, head.hash, head.pid, True)
